"""Quantization and precision: the int8 paths' diagnosis (int8_chain, int8_layers: the layers that cost accuracy)
and repair (int8_repair), NNCF's accuracy control beside it (int8_nncf), and the float16 repair (float16_repair).

May import ``parity.diagnose.causes``, ``parity.diagnose.graph`` and ``parity.diagnose.tree``.
"""
