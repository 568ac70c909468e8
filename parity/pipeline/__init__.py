"""The jobs the CLI starts: the orchestrated run (verify, export, check, gate, time, diagnose) and
`parity init`. Imports every stage before it; only the CLI and parity.testing import it.
"""
