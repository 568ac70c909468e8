"""The Runner contract every source and runtime implements."""

from __future__ import annotations

import numpy as np

from parity.platform.errors import NotDifferentiable, ParityError


class ShapeMismatch(ParityError):
    """An input whose shape or dtype does not match the model's input spec."""


class Runner:
    """Runs one model on a batch in canonical layout and returns named outputs.

    Subclasses implement ``run_impl``; differentiable ones set ``differentiable = True`` and
    implement ``gradients_impl``, ``train_step_impl`` and ``trainable_weights_impl``; those that
    can report intermediate layers implement ``taps_impl``. The public methods check the feed first.
    """

    differentiable = False

    def __init__(self, spec, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"):
        self.spec = spec
        self.dtype = dtype  # the host dtype of feeds (float32, or float64 for a reference); see ``precision``
        self.device = device  # "cpu" or "cuda:N" (inside a worker the chosen GPU is CUDA device 0)
        self.precision = precision
        self.numerics: dict = {}  # every flag that changes numerics, as the runner set it (in the result)
        self.expected_shape = (batch_size, *spec.input.shape)

    def check_feed(self, x: np.ndarray) -> np.ndarray:
        if tuple(x.shape) != self.expected_shape:
            raise ShapeMismatch(
                f"input {self.spec.input.name!r} has shape {tuple(x.shape)}, the model takes {self.expected_shape}"
            )
        integer = np.dtype(self.spec.input.dtype).kind in "iu"  # token ids stay integers
        return np.ascontiguousarray(x, dtype=self.spec.input.dtype if integer else self.dtype)

    @property
    def compute_dtype(self) -> str:
        """The dtype weights and activations are held in: the reference's float64, else the precision's."""
        from parity.platform.precision import get

        return "float64" if self.dtype == "float64" else get(self.precision).dtype

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs by name for input batch ``x`` (canonical layout); float16 / bfloat16 results as float32."""
        outputs = self.run_impl(self.check_feed(x))
        return widened(dict(zip(self.spec.outputs, outputs)))

    def taps(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Intermediate layer outputs by tap name, in canonical layout."""
        return widened(self.taps_impl(self.check_feed(x)))

    def gradients(self, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        """Gradients of mean cross-entropy(logits, labels) w.r.t. every trainable parameter
        (canonical names and layout) and the input (``input:<name>``)."""
        if not self.differentiable:
            raise NotDifferentiable(f"{type(self).__name__} cannot differentiate")
        return widened(self.gradients_impl(self.check_feed(x), np.asarray(labels, dtype=np.int64)))

    def train_step(self, x: np.ndarray, labels: np.ndarray, lr: float) -> None:
        """One plain-SGD step in place: forward, mean cross-entropy of the first output vs ``labels``
        (the loss ``gradients`` differentiates), backward, ``w -= lr * grad`` for every parameter
        ``optimized_params`` names. Nothing is left pending when it returns: it is the timed region
        of a training step."""
        if not self.differentiable:
            raise NotDifferentiable(f"{type(self).__name__} cannot differentiate, so it cannot take a training step")
        self.train_step_impl(self.check_feed(x), np.asarray(labels, dtype=np.int64), float(lr))

    def trainable_weights(self) -> dict[str, np.ndarray]:
        """The current trainable weights (copies), canonical names and layout, in the runner's dtype."""
        if not self.differentiable:
            raise NotDifferentiable(f"{type(self).__name__} cannot differentiate, so it has no trainable weights")
        return widened(self.trainable_weights_impl())

    def optimized_params(self) -> list[str]:
        """Canonical names of the parameters ``train_step`` updates (what the optimizer is given):
        every trainable parameter. Read once, when a runner builds its step."""
        return list(self.spec.trainable_params)

    def device_compute(self, x: np.ndarray):
        """On a GPU: a zero-argument function that runs the model once on ``x`` (a checked feed, see
        ``check_feed``), put on the device beforehand, and returns when the device has finished (no host
        copies): what GPU compute time is measured on.
        None where the runner has no device-resident form (CPU runners, the host-only reference)."""

    def device_memory_peak_mb(self) -> float | None:
        """Peak device memory this runner's allocator has held, in MiB, where it can tell (else None)."""

    def run_impl(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def taps_impl(self, x: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} does not report taps")

    def gradients_impl(self, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def train_step_impl(self, x: np.ndarray, labels: np.ndarray, lr: float) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement a training step")

    def trainable_weights_impl(self) -> dict[str, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} does not report its trainable weights")


def widened(arrays: dict) -> dict:
    """float16 / bfloat16 arrays as float32 (exactly: every such value is a float32), others as they are."""
    return {k: np.asarray(v, dtype=np.float32) if v.dtype.kind in "fV" and v.dtype.itemsize < 4 else v
            for k, v in arrays.items()}


def as_tuple(outputs) -> tuple:
    if isinstance(outputs, (list, tuple)):
        return tuple(outputs)
    return (outputs,)


def run_batched(runner, x: np.ndarray, batch_size: int) -> dict[str, np.ndarray]:
    """Run a static-batch runner over any number of samples (the last batch zero-padded)."""
    n = len(x)
    chunks = []
    for start in range(0, n, batch_size):
        block = x[start:start + batch_size]
        if len(block) < batch_size:
            block = np.concatenate([block, np.zeros((batch_size - len(block), *x.shape[1:]), x.dtype)])
        chunks.append(runner.run(block))
    return {name: np.concatenate([c[name] for c in chunks])[:n] for name in chunks[0]}
