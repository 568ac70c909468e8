"""Drift diagnosis. Imports stages up to run; never bench, report or pipeline.

Here, the core: the chain of one path (chain: taps against the golden, the first divergent tap, a tested cause, the
link where the drift enters; collect: its worker task; links, patterns, eval_split), the descent into the model's
own tree as the orchestrator starts it (descend), and the reproducers a diagnosis writes (repro: the failing graph
reduced; repro_native: the leaf alone in the path's own format). The core may import every room below.

Rooms, bottom to top; each imports only the rooms before it (``tests/test_house.py``'s ``ROOMS``):
  causes/     what a drift is measured and tested by, NumPy only: drift per tap, the tested cause, layers/
  graph/      the ONNX graph work: taps in an exported graph, its ops and node causes, reduction, the optimiser
  tree/       the descent's worker side and one tree reader per framework and runtime, in a registry
  precision/  quantization and precision: the int8 paths' diagnosis and repair, the float16 repair
"""
