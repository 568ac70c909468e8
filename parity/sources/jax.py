"""JAX source: the spec's pure function ``jax_apply(params, x, tap)`` under ``jax.jit``."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from parity.model import layouts, outputs
from parity.platform.errors import Unavailable, WeightsMismatch, one_line
from parity.platform.precision import jax_flags
from parity.runtimes.base import Runner


class _ReadRecorder(Mapping):
    """Records which parameter names the definition reads, to report missing and unused ones."""

    def __init__(self, params):
        self.params, self.read, self.missing = params, set(), []

    def __getitem__(self, name):
        if name not in self.params:
            self.missing.append(name)
            raise KeyError(name)
        self.read.add(name)
        return self.params[name]

    def __iter__(self):
        return iter(self.params)

    def __len__(self):
        return len(self.params)


def enable_x64_if_needed(dtype: str) -> None:
    import jax

    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)


def check_definition(spec, params, batch_size: int, dtype: str) -> None:
    """Trace the definition once, its floating inputs in ``dtype`` (the run's compute dtype; a model may have no
    parameters), and raise ``WeightsMismatch`` for missing / unused / mis-shaped names."""
    import jax

    x = packed(
        {
            i.name: jax.ShapeDtypeStruct(spec.input_shape(i.name, batch_size), dtype if i.floating else i.dtype)
            for i in spec.model_inputs
        }
    )
    recorder: _ReadRecorder | None = None  # the trace's, set as it starts

    def traced(p, x):
        nonlocal recorder
        recorder = _ReadRecorder(p)
        return spec.jax_apply(recorder, x, None)

    try:
        jax.eval_shape(traced, dict(params), x)
    except KeyError:
        assert recorder is not None
        raise WeightsMismatch("jax", missing=recorder.missing) from None
    except TypeError as error:  # shape errors from jnp ops
        raise WeightsMismatch("jax", misshaped=[("(see trace)", "?", str(error).splitlines()[0])]) from None
    assert recorder is not None
    unused = [name for name in params if name not in recorder.read]
    if unused:
        raise WeightsMismatch("jax", unexpected=unused)


def packed(feeds: dict):
    """What ``jax_apply`` takes as its input: the only input's array, or a tuple of several in the order of
    ``feeds`` (the spec's; not a dict, whose keys JAX's pytrees would sort)."""
    return next(iter(feeds.values())) if len(feeds) == 1 else tuple(feeds.values())


def forward_outputs(spec, returned) -> tuple:
    """The spec's outputs of what ``jax_apply`` returned (an array, a tuple, a dict, ...), in the spec's order."""
    import jax

    return tuple(outputs.named(spec.outputs, outputs.flatten(returned, lambda v: isinstance(v, jax.Array))).values())


def make_loss(spec):
    import jax
    import jax.numpy as jnp

    def loss(params, x, labels):
        logits = forward_outputs(spec, spec.jax_apply(params, x, None))[0]
        # the loss of reduced-precision logits in float32, as mixed-precision training computes it
        log_probs = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
        return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=-1))

    return loss


def jax_device(jax, device: str):
    """The JAX device for ``cpu`` / ``cuda:N`` (inside a worker the chosen GPU is CUDA device 0)."""
    try:
        return jax.devices("cpu" if device == "cpu" else "gpu")[0]
    except RuntimeError as error:
        raise Unavailable(f"jax {jax.__version__} has no {device} backend ({one_line(error, 160)})") from None


class JaxSource(Runner):
    """The native ``jax`` path: ``jax.jit`` on the CPU or a CUDA GPU, in the precision's dtype."""

    differentiable = True

    def __init__(
        self, spec, weights, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"
    ):
        super().__init__(spec, batch_size, dtype, device, precision)
        enable_x64_if_needed(dtype)
        import jax
        import jax.numpy as jnp

        layouts.check_weights(spec.params, weights)
        self.jax = jax
        self.jax_device = jax_device(jax, device)
        self.numerics = jax_flags(jax, precision, device)
        self.params = {
            name: jax.device_put(jnp.asarray(self._held(name, weights[name])), self.jax_device) for name in spec.params
        }
        check_definition(spec, self.params, batch_size, self.compute_dtype)
        self._forward = jax.jit(lambda p, x: forward_outputs(spec, spec.jax_apply(p, x, None)))
        self._step = None  # the jitted SGD update, made by the first train_step

    def _held(self, name: str, value: np.ndarray) -> np.ndarray:
        """A weight in the dtype the run holds it in (``layouts.held_dtype``); float64 needs JAX's x64 mode."""
        param = self.spec.params[name]
        # jax sets its flags on the config at run time: its Config class declares none of them
        if layouts.held_dtype(param.dtype, self.compute_dtype) == "float64" and not self.jax.config.jax_enable_x64:  # type: ignore[attr-defined]
            raise Unavailable(
                f"parameter {name!r} is float64, which JAX holds only with jax_enable_x64 (off for a "
                f"{self.precision} run): JAX would narrow it to float32"
            )
        return layouts.held_array(param, value, self.compute_dtype)

    def _on_device(self, feeds: dict) -> dict:
        """Feeds on the device, floating ones in the compute dtype."""
        dtype = self.jax.numpy.dtype(self.compute_dtype)
        return {
            name: self.jax.device_put(x.astype(dtype) if x.dtype.kind == "f" else x, self.jax_device)
            for name, x in feeds.items()
        }

    def _input(self, feeds: dict):
        """What ``jax_apply`` takes (``packed``), on the device."""
        return packed(self._on_device(feeds))

    def run_impl(self, x):
        return tuple(np.asarray(t) for t in self._forward(self.params, self._input(x)))

    def device_compute(self, x):
        if self.device == "cpu":
            return None
        x_dev = self._input(x)
        return lambda: self.jax.block_until_ready(self._forward(self.params, x_dev))

    def device_memory_peak_mb(self):
        if self.device == "cpu":
            return None
        peak = (self.jax_device.memory_stats() or {}).get("peak_bytes_in_use")
        return None if peak is None else peak / 2**20

    def taps_impl(self, x):
        spec = self.spec

        def collect(p, x):
            taps = {}
            spec.jax_apply(p, x, taps.__setitem__)
            return taps

        taps = self.jax.jit(collect)(self.params, self._input(x))
        return {name: np.asarray(taps[name]) for name in spec.taps}

    def gradients_impl(self, x, labels):
        spec = self.spec
        trainable = {name: self.params[name] for name in spec.trainable_params}
        frozen = {name: v for name, v in self.params.items() if name not in trainable}
        loss = make_loss(spec)
        inputs = self._on_device(x)
        differentiated = {name: inputs[name] for name in spec.input_grad_names}
        fixed = {name: value for name, value in inputs.items() if name not in differentiated}  # integer ids, masks

        def objective(t, d):
            return loss({**frozen, **t}, packed({i.name: {**fixed, **d}[i.name] for i in spec.model_inputs}), labels)

        grad_fn = self.jax.jit(self.jax.grad(objective, argnums=(0, 1)))
        param_grads, input_grads = grad_fn(trainable, differentiated)
        result = {name: np.asarray(g) for name, g in param_grads.items()}
        for name, g in input_grads.items():
            result[spec.input_grad_names[name]] = np.asarray(g)
        return result

    def train_step_impl(self, x, labels, lr):
        jax = self.jax
        if self._step is None:
            self._updated = self.optimized_params()
            self._step = jax.jit(sgd_update(jax, self.spec))
        updated = {name: self.params[name] for name in self._updated}
        rest = {name: v for name, v in self.params.items() if name not in updated}
        new = jax.block_until_ready(
            self._step(
                updated, rest, self._input(x), labels, np.asarray(lr, dtype=self.jax.numpy.dtype(self.compute_dtype))
            )
        )
        self.params = {**self.params, **new}

    def trainable_weights_impl(self):
        return {name: np.array(self.params[name]) for name in self.spec.trainable_params}


def sgd_update(jax, spec):
    """``(updated, rest, x, labels, lr) -> updated - lr * grad``: the gradient of the mean cross-entropy
    w.r.t. the ``updated`` parameters (``rest`` held fixed), as new arrays."""
    loss = make_loss(spec)

    def update(updated, rest, x, labels, lr):
        grads = jax.grad(lambda u: loss({**rest, **u}, x, labels))(updated)
        return jax.tree_util.tree_map(lambda w, g: w - lr * g, updated, grads)

    return update
