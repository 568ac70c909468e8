"""Reports: the terminal tables and live progress, the JSON document, the HTML diagnosis report, `parity compare`.
Imports stages up to diagnose (never pipeline); reports read results, they compute no verdict.
"""
