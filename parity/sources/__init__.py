"""Source frameworks: build a reference model from canonical weights and run it natively.

Each source is also a ``Runner`` (the native path: ``torch``, ``tf``, ``jax``) and can
differentiate, report layer taps and run in float64 for golden data.
"""
