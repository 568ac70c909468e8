"""Reports: the terminal tables and live progress, the JSON document, JUnit XML, the HTML report, `parity compare`.
Imports stages up to diagnose (never pipeline); reports read results, they compute no verdict.
"""
