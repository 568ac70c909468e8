"""A JAX model whose special function JAX lowers to a StableHLO composite (``jax.scipy.special.erf`` serialises as
``stablehlo.composite "chlo.erf"``), for the ``jax/tf`` path's tests."""

from __future__ import annotations

import numpy as np


def apply(params, x, tap=None):
    """Dense -> GELU in its erf form (``jax.scipy.special.erf``) -> Dense."""
    import jax.numpy as jnp
    from jax.scipy.special import erf

    h = x @ params["dense1"]["kernel"] + params["dense1"]["bias"]
    if tap is not None:
        tap("dense1", h)
    h = 0.5 * h * (1.0 + erf(h / np.sqrt(2.0)))
    return jnp.sinh(0.5 * h) @ params["out"]["kernel"] + params["out"]["bias"]


def save_params(path) -> None:
    rng = np.random.default_rng(0)
    np.savez(
        path,
        **{
            "dense1/kernel": (rng.standard_normal((5, 7)) / 2).astype(np.float32),
            "dense1/bias": rng.standard_normal(7).astype(np.float32),
            "out/kernel": rng.standard_normal((7, 3)).astype(np.float32),
            "out/bias": np.zeros(3, np.float32),
        },
    )
