"""Source frameworks (torch, tf, jax): a reference model built from canonical weights and run natively, as a
``Runner`` that differentiates, reports taps and runs in float64 for golden data. Imports up to runtimes.
"""

import importlib

RUNNERS = {"torch": "TorchSource", "tf": "KerasSource", "jax": "JaxSource"}


def native(framework: str):
    """The ``Runner`` class of ``framework``'s own definition (``torch``, ``tf``, ``jax``)."""
    return getattr(importlib.import_module(f"parity.sources.{framework}"), RUNNERS[framework])
