"""The jobs the CLI starts: the orchestrated run (verify, export, check, gate, time, diagnose), golden data, `parity
init`, `parity repro` and `parity check-onnx`. Imports every stage before it; only the CLI and parity.testing import it.
"""
