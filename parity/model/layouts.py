"""Canonical <-> framework layouts for weights, inputs and activations (NumPy only).

Canonical layouts: dense kernels ``(in, out)``, conv kernels ``OIHW``, images ``NCHW``.
Every conversion has an inverse; gradients come back to canonical layout through it.
"""

from __future__ import annotations

import numpy as np

# axes permutations; an absent entry means the layout is the same as canonical
_PARAM_PERMUTATIONS: dict[str, dict[str, tuple[int, ...]]] = {
    "torch": {"dense_kernel": (1, 0)},
    "tf": {"conv_kernel": (2, 3, 1, 0)},  # OIHW -> HWIO
    "jax": {},
    "spec": {},
}
# canonical variable name -> torch attribute name (the last component of a parameter name)
_TORCH_VARIABLE_NAMES = {
    "kernel": "weight",
    "gamma": "weight",
    "beta": "bias",
    "moving_mean": "running_mean",
    "moving_variance": "running_var",
}
_NCHW_TO_NHWC = (0, 2, 3, 1)


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def param_to_framework(framework: str, kind: str, value: np.ndarray) -> np.ndarray:
    """Canonical parameter array -> the framework's own layout."""
    perm = _PARAM_PERMUTATIONS[framework].get(kind)
    return value if perm is None else np.ascontiguousarray(np.transpose(value, perm))


def param_from_framework(framework: str, kind: str, value: np.ndarray) -> np.ndarray:
    """The framework's own layout -> canonical (the inverse of ``param_to_framework``)."""
    perm = _PARAM_PERMUTATIONS[framework].get(kind)
    return value if perm is None else np.ascontiguousarray(np.transpose(value, _inverse(perm)))


def framework_shape(framework: str, kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    perm = _PARAM_PERMUTATIONS[framework].get(kind)
    return tuple(shape) if perm is None else tuple(shape[i] for i in perm)


def torch_param_name(canonical: str) -> str:
    """``block0_attn/query/kernel`` -> ``block0_attn.query.weight``."""
    *layers, variable = canonical.split("/")
    return ".".join([*layers, _TORCH_VARIABLE_NAMES.get(variable, variable)])


def activation_layout(framework: str, input_layout: str) -> str:
    """The activation layout a framework's definition uses for a canonical input layout."""
    return "nhwc" if (framework == "tf" and input_layout == "nchw") else input_layout


def to_layout(array: np.ndarray, canonical_layout: str, layout: str) -> np.ndarray:
    """Convert an input or activation from canonical layout to ``layout`` (4-D arrays only)."""
    if canonical_layout == layout or array.ndim != 4:
        return array
    if (canonical_layout, layout) == ("nchw", "nhwc"):
        return np.ascontiguousarray(np.transpose(array, _NCHW_TO_NHWC))
    raise ValueError(f"no conversion from {canonical_layout} to {layout}")


def from_layout(array: np.ndarray, canonical_layout: str, layout: str) -> np.ndarray:
    """Convert an input, activation or input gradient from ``layout`` back to canonical."""
    if canonical_layout == layout or array.ndim != 4:
        return array
    if (canonical_layout, layout) == ("nchw", "nhwc"):
        return np.ascontiguousarray(np.transpose(array, _inverse(_NCHW_TO_NHWC)))
    raise ValueError(f"no conversion from {layout} to {canonical_layout}")


def check_names_and_shapes(framework: str, spec_params: dict, found_shapes: dict[str, tuple]) -> None:
    """Raise ``WeightsMismatch`` listing missing, unexpected and mis-shaped names.

    ``found_shapes`` maps canonical names to the shapes the framework definition has, in the
    framework's own layout.
    """
    from parity.platform.errors import WeightsMismatch

    missing = [n for n in spec_params if n not in found_shapes]
    unexpected = [n for n in found_shapes if n not in spec_params]
    misshaped = []
    for name, param in spec_params.items():
        if name in found_shapes:
            want = framework_shape(framework, param.kind, param.shape)
            if tuple(found_shapes[name]) != want:
                misshaped.append((name, want, tuple(found_shapes[name])))
    if missing or unexpected or misshaped:
        raise WeightsMismatch(framework, missing, unexpected, misshaped)


def held_dtype(own: str, run_dtype: str) -> str:
    """The dtype a weight of dtype ``own`` is held in by a run in ``run_dtype``: a float64 run (the reference)
    widens every weight, exactly; float32 weights take the run's dtype (its precision); a weight the model keeps
    in another dtype (a float64 gain, a float16 table) keeps it."""
    if run_dtype == "float64" or own == "float32":
        return run_dtype
    return own


def held_array(param, value: np.ndarray, run_dtype: str) -> np.ndarray:
    """``value`` (a weight of ``param``, a ``ParamSpec``) as a run in ``run_dtype`` holds it (``held_dtype``)."""
    import ml_dtypes

    held = held_dtype(param.dtype, run_dtype)
    return np.asarray(value).astype(ml_dtypes.bfloat16 if held == "bfloat16" else held)


def check_weights(spec_params: dict, weights: dict[str, np.ndarray]) -> None:
    """Canonical weights against the spec's parameter table."""
    check_names_and_shapes("spec", spec_params, {k: v.shape for k, v in weights.items()})
