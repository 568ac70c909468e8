"""The Runner contract every source and runtime implements."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from parity.model import containers, values
from parity.model.feeds import as_feeds
from parity.platform.errors import NotDifferentiable, ParityError

if TYPE_CHECKING:
    from parity.model.spec import ModelSpec

# what the public methods take: ``{input name: array-like}``, or a one-input model's array alone
Feeds = Any


class ShapeMismatch(ParityError):
    """An input whose shape or dtype does not match the model's input spec."""


class Runner:
    """Runs one model on a batch of feeds (``{input name: array}``, canonical layout) and returns named outputs.

    Subclasses implement ``run_impl`` (feeds in, the model's returned structure or a tuple in output order
    out: ``parity.model.outputs`` names it); differentiable ones set ``differentiable = True`` and implement
    ``gradients_impl``, ``train_step_impl`` and ``trainable_weights_impl``; those that can report
    intermediate layers implement ``taps_impl``. The public methods check the feeds first; a model with one
    input may be given its array alone.
    """

    differentiable: bool = False
    # a runtime of an exported artifact that implements ``taps_impl`` says where it read each tap:
    # ``{tap: {"found", "tensor"?, "reason"?}}`` (``parity.diagnose.causes.drift.tap_rows``); others say why they have
    # none
    tap_locations: dict[str, dict[str, Any]] = {}  # noqa: RUF012 (a runner assigns its own; never mutated)
    no_taps_reason: str = (
        "taps are read from ONNX graphs on the CPU runtimes only; on a GPU runtime outputs are "
        "compared (diagnose the same path with --device cpu to locate the tap)"
    )

    def __init__(
        self, spec: ModelSpec, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"
    ) -> None:
        self.spec = spec
        self.dtype = dtype  # the host dtype of float feeds (float32, or float64 for a reference); see ``precision``
        self.device = device  # "cpu" or "cuda:N" (inside a worker the chosen GPU is CUDA device 0)
        self.precision = precision
        self.numerics: dict[str, Any] = {}  # every flag that changes numerics, as the runner set it (in the result)
        self.output_structures: dict[
            str, dict[str, Any]
        ] = {}  # the last run's sequence and optional outputs' structures
        self.batch_size = batch_size
        self._output_kinds = containers.output_kinds(spec)  # an ONNX graph's sequence and optional outputs
        self._computed: dict[str, np.ndarray] = {}  # the last run's outputs as computed, before widening

    def check_feed(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """``feeds`` checked against the spec (every input, nothing else; rank, fixed sizes, one size per named
        axis and the batch axis across inputs, any size: a runtime that fixed one says so itself; integer inputs
        given integers) and converted: float inputs to the runner's host dtype, others to
        their declared dtype."""
        spec = self.spec
        feeds = as_feeds(spec, feeds)
        declared = [i.name for i in spec.model_inputs]
        unknown = [name for name in feeds if name not in declared]
        if unknown:
            raise ShapeMismatch(
                f"input {unknown[0]!r} is not an input of model {spec.name!r} (it takes {', '.join(declared)})"
            )
        checked: dict[str, np.ndarray] = {}
        sizes: dict[str, tuple[int, str]] = {}
        for i in spec.model_inputs:
            if i.name not in feeds:
                raise ShapeMismatch(f"input {i.name!r} of model {spec.name!r} is missing")
            x = np.asarray(feeds[i.name])
            expected = i.full_shape(0, spec.axes)
            shown = "(" + ", ".join(str(name or size) for name, size in zip(i.axis_names, expected)) + ")"
            if x.ndim != len(expected) or any(
                not name and e != a for name, e, a in zip(i.axis_names, expected, x.shape)
            ):
                raise ShapeMismatch(f"input {i.name!r} has shape {tuple(x.shape)}, the model takes {shown}")
            for name, size in zip(i.axis_names, x.shape):  # a named axis has one size across the inputs
                if name and sizes.setdefault(name, (size, i.name))[0] != size:
                    raise ShapeMismatch(
                        f"axis {name!r} is {size} in input {i.name!r} but {sizes[name][0]} in input {sizes[name][1]!r}"
                    )
            if not i.floating and x.dtype.kind == "f":
                raise ShapeMismatch(f"input {i.name!r} is {i.dtype}; it was given {x.dtype} values")
            # floating inputs in the runner's host dtype, a float64 input always in float64 (the model's own type)
            dtype = ("float64" if i.dtype == "float64" else self.dtype) if i.floating else i.dtype
            if i.dtype in values.LOW_PRECISION:  # golden data's raw bits, or values, in the graph's own dtype
                checked[i.name] = values.as_low_precision(x, i.dtype)
                continue
            if i.dtype == values.TEXT:
                if not values.is_text(x):
                    raise ShapeMismatch(f"input {i.name!r} is a string tensor; it was given {x.dtype} values")
                checked[i.name] = values.text(x)
                continue
            # np.asarray keeps a scalar 0-d (np.ascontiguousarray would make it shape (1,), which a runtime may refuse)
            checked[i.name] = np.asarray(x, dtype=dtype, order="C")
        return checked

    @property
    def compute_dtype(self) -> str:
        """The dtype weights and activations are held in: the reference's float64, else the precision's."""
        from parity.platform.precision import get

        return "float64" if self.dtype == "float64" else get(self.precision).dtype

    def run(self, x: Feeds) -> dict[str, np.ndarray]:
        """Outputs by the spec's names for the batch of feeds ``x`` (canonical layout); float16 / bfloat16 results
        as float32."""
        returned = self.run_impl(self.check_feed(x))
        if self._output_kinds:  # an ONNX graph's sequences and optionals: split into elements, structures kept
            outputs, self.output_structures = containers.flat_outputs(
                self.spec.outputs, as_tuple(returned), self._output_kinds
            )
            outputs = {name: np.asarray(value) for name, value in outputs.items()}
        else:
            outputs = named_outputs(self.spec, returned)
        self._computed = {name: values.text(v) if v.dtype.kind in "OS" else v for name, v in outputs.items()}
        return widened(self._computed)

    def as_computed(self) -> dict[str, np.ndarray] | None:
        """The last run's outputs as the model gave them, by the spec's names (none widened); None where one was a
        container split into elements or text."""
        if self._output_kinds or any(v.dtype.kind in "OSU" for v in self._computed.values()):
            return None
        return dict(self._computed)

    @property
    def output_dtypes(self) -> dict[str, str]:
        """The dtype each output of the last run was computed in, before widening: a float16 output is judged at
        float16's tolerance (``parity.check.closeness.OutputTolerances``)."""
        return {name: str(value.dtype) for name, value in self._computed.items()}

    def taps(self, x: Feeds) -> dict[str, np.ndarray]:
        """Intermediate layer outputs by tap name, in canonical layout."""
        return widened(self.taps_impl(self.check_feed(x)))

    def gradients(self, x: Feeds, labels: np.ndarray) -> dict[str, np.ndarray]:
        """Gradients of mean cross-entropy(first output, labels) w.r.t. every trainable parameter (canonical
        names and layout) and every floating-point input (``input:<name>``; integer and bool inputs have none)."""
        if not self.differentiable:
            raise NotDifferentiable(f"{type(self).__name__} cannot differentiate")
        return widened(self.gradients_impl(self.check_feed(x), np.asarray(labels, dtype=np.int64)))

    def train_step(self, x: Feeds, labels: np.ndarray, lr: float) -> None:
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

    def runtime_record(self) -> dict[str, Any] | None:
        """What the runtime did that the result should say beside its numerics, read once the check has run every
        shape: a compiler's graphs and recompilations, the precision a plugin really ran at. None where nothing."""

    def device_compute(self, x: dict[str, np.ndarray]) -> Callable[[], object] | None:
        """On a GPU: a zero-argument function that runs the model once on feeds ``x`` (checked, see
        ``check_feed``), put on the device beforehand, and returns when the device has finished (no host
        copies): what GPU compute time is measured on.
        None where the runner has no device-resident form (CPU runners, the host-only reference)."""

    def device_memory_peak_mb(self) -> float | None:
        """Peak device memory this runner's allocator has held, in MiB, where it can tell (else None)."""

    def run_impl(self, x: dict[str, np.ndarray]) -> Any:
        raise NotImplementedError

    def taps_impl(self, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} does not report taps")

    def gradients_impl(self, x: dict[str, np.ndarray], labels: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def train_step_impl(self, x: dict[str, np.ndarray], labels: np.ndarray, lr: float) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement a training step")

    def trainable_weights_impl(self) -> dict[str, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} does not report its trainable weights")


def widened(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float16 / bfloat16 / float8 / float4 arrays as float32 (exactly: every such value is a float32), int4 and
    uint4 as int8 and uint8 (integers stay integers), others as they are."""
    four_bit = {"int4": np.int8, "uint4": np.uint8}
    return {
        k: np.asarray(v, dtype=four_bit.get(v.dtype.name, np.float32))
        if v.dtype.kind in "fV" and v.dtype.itemsize < 4
        else v
        for k, v in arrays.items()
    }


def is_array(value: object) -> bool:
    """A host array (what runners hand to ``named_outputs``; framework tensors are converted first)."""
    return isinstance(value, np.ndarray) or (np.isscalar(value) and not isinstance(value, (str, bytes)))


def named_outputs(spec: ModelSpec, returned: object) -> dict[str, np.ndarray]:
    """A runner's returned structure of host arrays as ``{output name: array}`` in the spec's order."""
    from parity.model import outputs

    return {
        name: np.asarray(value)
        for name, value in outputs.named(spec.outputs, outputs.flatten(returned, is_array)).items()
    }


def as_tuple(outputs: object) -> tuple[Any, ...]:
    if isinstance(outputs, (list, tuple)):
        return tuple(outputs)
    return (outputs,)
