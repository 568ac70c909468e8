"""What a drift is measured and tested by, NumPy only: drift per tap and the first divergent tap (drift), a tested
cause for one layer (cause), and one NumPy module per layer kind with its known variants (layers/).

Imports no other room of ``parity.diagnose``.
"""
