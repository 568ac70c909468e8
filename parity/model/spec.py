"""ModelSpec: everything parity knows about a reference model, declared as data.

A model file in a workspace's ``models/`` folder defines ``SPEC = ModelSpec(...)``. The file
must import no ML framework at module level: the framework builders (``torch_module``,
``keras_model``, ``jax_apply``) import their framework inside the function, and only worker
processes call them.

Canonical conventions (framework-neutral, what golden data is stored in):

* parameter names are ``layer/variable`` (Keras variable paths), e.g. ``dense1/kernel``;
* dense kernels are ``(in, out)``, conv kernels ``OIHW``; BatchNorm uses ``gamma``, ``beta``,
  ``moving_mean``, ``moving_variance``;
* image inputs are ``NCHW``; every framework converts at its edge (see ``parity.model.layouts``);
* tap names are the names of top-level layers (Keras layer, torch submodule), reported by
  the JAX definition through its ``tap(name, value)`` callback.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from parity.model.spec_parts import (
    BATCH,
    CALIBRATION_METHODS,
    INPUT_DTYPES,
    INPUT_LAYOUTS,
    LAYER_KINDS,
    LOSSES,
    MODEL_INPUT,
    PARAM_DTYPES,
    PARAM_KINDS,
    PRECISIONS,
    VALUE_KINDS,
    Gate,
    InputSpec,
    Layer,
    MetricRules,
    ParamSpec,
    Quantization,
    Tolerance,
    Tolerances,
    Training,
    Values,
)

# what a model file imports from here: the spec and its parts (``parity.model.spec_parts``)
__all__ = [
    "BATCH",
    "CALIBRATION_METHODS",
    "INPUT_DTYPES",
    "INPUT_LAYOUTS",
    "LAYER_KINDS",
    "LOSSES",
    "MODEL_INPUT",
    "PARAM_DTYPES",
    "PARAM_KINDS",
    "PRECISIONS",
    "VALUE_KINDS",
    "Gate",
    "InputSpec",
    "Layer",
    "MetricRules",
    "ModelSpec",
    "ParamSpec",
    "Quantization",
    "Tolerance",
    "Tolerances",
    "Training",
    "Values",
]


def _at_precision(declared: dict[str, Tolerances], precision: str, gradients: bool) -> Tolerances:
    """The declared tolerances, or for a reduced precision without them the dtype's default (never tighter
    than the declared fp32 ones)."""
    if precision in declared:
        return declared[precision]
    from parity.platform.precision import default_tolerance

    fp32 = declared["fp32"]
    atol, rtol = default_tolerance(precision, gradients)

    def widen(t: Tolerance) -> Tolerance:
        return replace(t, atol=max(t.atol, atol), rtol=max(t.rtol, rtol))

    return Tolerances(widen(fp32.default), {name: widen(t) for name, t in fp32.overrides.items()})


@dataclass
class ModelSpec:
    """A reference model, written once per framework, with everything needed to check it.

    Arguments:
        name: model name (the file name in ``models/`` without ``.py``).
        description: one line.
        input: the model input (``InputSpec``), or a tuple of them for a model with several inputs (a torch
            module gets them as keywords, a Keras model as a dict, a JAX ``jax_apply`` as one tuple in order, a user's ``apply(params, *inputs)`` positionally).
        outputs: output names: the names the model's returned structure flattens to (``parity.model.outputs``:
            dict keys, dataclass fields, ``out.<i>`` for sequence items, joined with ``.``), or, for a model
            returning one tensor or a plain tuple, names given to its outputs in order.
        axes: golden sizes of the named dynamic axes of the inputs (``{"sequence": 16}``); the batch axis's
            is ``batch_size``.
        verify_shapes: the shapes besides the golden one every path is verified at, each ``{axis: size}`` (axes
            left out keep their golden size); default ``default_shapes``: batch 1, and batch 3 with every
            named axis at half its golden size (2 for a size of 1). ``()``: the golden shape alone.
        num_classes: classifier width, for metrics.
        params: canonical parameter names -> ``ParamSpec``, in network order.
        taps: named layer boundaries in network order (used for drift diagnosis).
        tree_skip: module paths (and everything under them) the descent into the model's own tree does not
            compare: a module that draws random numbers, or whose output is not meant to match.
        layers: tap name -> ``Layer``: what the tap computes, so a diagnosis can test causes
            (a tap without one is still compared, but no cause is tested for it).
        tolerances: precision -> ``Tolerances`` for outputs (per-output overrides).
        grad_tolerances: precision -> ``Tolerances`` for gradients (per-parameter overrides;
            the input gradient is named ``input:<input name>``).
        training: how the weights are made (``Training``).
        torch_module: ``() -> torch.nn.Module``; ``forward(x)`` returns the outputs.
        keras_model: ``(dtype: str) -> keras.Model`` (functional; taps are layer names).
        jax_apply: ``(params, x, tap) -> tuple of outputs``; ``tap(name, value)`` may be None.
        weights_from_model: the weights are the model's own, as the builder returns it (a user model:
            no training recipe); parameter names are the framework's own and ``params`` is read from
            the golden data (see ``parity.model.user``).
        inputs: how the golden inputs of a user model are made (``parity.model.user.InputData``).
        loss: the loss whose gradients are checked (``"cross_entropy"`` of the first output against
            the labels), or None for no gradients.
        onnx_model: an ONNX file (relative to the workspace) that is itself the source model.
        containers: an ONNX graph's sequence and optional inputs and outputs (``parity.model.containers``):
            ``{"inputs": {name: structure}, "outputs": {name: {"kind": ...}}}``; an input's elements are inputs.
        expected_errors: path glob -> reason. A path ending in ``error`` there is expected
            (like pytest's xfail); if it passes, that is reported as an unexpected pass.
        require_determinism: fail a path whose two runs are not bitwise identical.
        batch_size: the static batch every path is exported and checked with.
        bench_batch_sizes: the batch sizes ``bench`` times (default: ``batch_size`` alone); each is
            exported and verified against the golden eval logits before it is timed.
        opset: ONNX opset for every exporter.
        metric_rules: ``MetricRules``.
        gate: the accuracy gate of quantized paths (``Gate``).
        quantization: how int8 paths quantize, and the layers each keeps in float (``Quantization``).
    """

    name: str
    description: str
    input: InputSpec | tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    axes: dict[str, int] = field(default_factory=dict)
    verify_shapes: tuple[dict[str, int], ...] | None = None
    num_classes: int = 0
    params: dict[str, ParamSpec] = field(default_factory=dict)
    taps: tuple[str, ...] = ()
    tree_skip: tuple[str, ...] = ()
    tolerances: dict[str, Tolerances] = field(default_factory=lambda: {"fp32": Tolerances(Tolerance(1e-5, 1e-5))})
    grad_tolerances: dict[str, Tolerances] = field(default_factory=lambda: {"fp32": Tolerances(Tolerance(1e-6, 1e-4))})
    layers: dict[str, Layer] = field(default_factory=dict)
    training: Training = Training()  # noqa: RUF009 - frozen (spec_parts)
    torch_module: Callable[[], Any] | None = None
    keras_model: Callable[[str], Any] | None = None
    jax_apply: Callable[..., Any] | None = None
    weights_from_model: bool = False
    inputs: Any = None
    loss: str | None = "cross_entropy"
    onnx_model: str | None = None
    expected_errors: dict[str, str] = field(default_factory=dict)
    require_determinism: bool = False
    batch_size: int = 64
    bench_batch_sizes: tuple[int, ...] = ()
    opset: int = 18
    metric_rules: MetricRules = MetricRules()  # noqa: RUF009 - frozen (spec_parts)
    gate: Gate = Gate()  # noqa: RUF009 - frozen (spec_parts)
    quantization: Quantization = Quantization()  # noqa: RUF009 - frozen (spec_parts)
    source_file: str | None = None
    containers: dict[str, Any] = field(default_factory=dict)

    @property
    def frameworks(self) -> tuple[str, ...]:
        """Source frameworks this model is written in, in a fixed order."""
        builders = {"torch": self.torch_module, "tf": self.keras_model, "jax": self.jax_apply, "onnx": self.onnx_model}
        return tuple(name for name, builder in builders.items() if builder is not None)

    @property
    def onnx_model_path(self) -> Path | None:
        """The source ONNX file, relative paths taken from the workspace (the folder above ``models/``)."""
        if self.onnx_model is None:
            return None
        root = Path(self.source_file).parent.parent if self.source_file else Path()
        return root / self.onnx_model  # an absolute path stays as it is

    @property
    def timed_batch_sizes(self) -> tuple[int, ...]:
        return tuple(self.bench_batch_sizes) or (self.batch_size,)

    @property
    def trainable_params(self) -> list[str]:
        return [name for name, p in self.params.items() if p.trainable]

    @property
    def model_inputs(self) -> tuple[InputSpec, ...]:
        """Every input, in the declared order."""
        return self.input if isinstance(self.input, tuple) else (self.input,)

    @property
    def input_grad_names(self) -> dict[str, str]:
        """Input name -> its gradient's name, for every floating-point input (integer and bool ones have none)."""
        return {i.name: f"input:{i.name}" for i in self.model_inputs if i.floating}

    def input_shape(
        self, name: str, batch_size: int | None = None, axes: dict[str, int] | None = None
    ) -> tuple[int, ...]:
        """The concrete shape of input ``name`` (default: at the golden batch size and axis sizes)."""
        spec = next(i for i in self.model_inputs if i.name == name)
        return spec.full_shape(self.batch_size if batch_size is None else batch_size, {**self.axes, **(axes or {})})

    def default_shapes(self) -> tuple[dict[str, int], ...]:
        """Batch 1, and batch 3 with every named axis at half its golden size (2 for a size of 1); none for a model
        without a batch axis or a named one."""
        batched = any(i.batched for i in self.model_inputs)
        second = {name: size // 2 if size > 1 else 2 for name, size in self.axes.items()}
        shapes = [{BATCH: 1}, {BATCH: 3, **second}] if batched else [second] if second else []
        return tuple(shapes)

    def check_shapes(self) -> list[dict[str, int]]:
        """Every verification shape besides the golden one, with every axis's size (``batch`` too where batched),
        in declared order, without repeats or the golden shape itself."""
        if self.containers:  # sequences and optionals have no batch axis: the graph is verified at its data's shape
            return []
        golden = {**({BATCH: self.batch_size} if any(i.batched for i in self.model_inputs) else {}), **self.axes}
        declared = self.default_shapes() if self.verify_shapes is None else self.verify_shapes
        shapes = []
        for shape in declared:
            full = {**golden, **shape}
            if full != golden and full not in shapes:
                shapes.append(full)
        return shapes

    def output_tolerances(self, precision: str) -> Tolerances:
        """Output tolerances at ``precision``: declared, else derived from the dtype (``parity.platform.precision``)."""
        return _at_precision(self.tolerances, precision, gradients=False)

    def gradient_tolerances(self, precision: str) -> Tolerances:
        """Gradient tolerances at ``precision``: declared, else derived from the dtype (looser than outputs)."""
        return _at_precision(self.grad_tolerances, precision, gradients=True)

    def layer_inputs(self, tap: str) -> tuple[str, ...]:
        """The taps (or ``"input"``) that feed ``tap``: declared, else the previous tap."""
        declared = self.layers.get(tap)
        if declared is not None and declared.inputs:
            return declared.inputs
        index = self.taps.index(tap)
        return (self.taps[index - 1],) if index else (MODEL_INPUT,)

    def expected_error(self, path_id: str) -> str | None:
        """The declared reason if ``path_id`` is expected to end in error, else None."""
        for pattern, reason in self.expected_errors.items():
            if fnmatch.fnmatchcase(path_id, pattern):
                return reason
        return None

    def validate(self) -> None:
        if not self.outputs:
            raise ValueError("a model needs at least one output")
        if len(set(self.outputs)) != len(self.outputs):
            raise ValueError(f"output names must be unique: {self.outputs}")
        if not all(isinstance(i, InputSpec) for i in self.model_inputs) or (
            not self.model_inputs and self.frameworks != ("onnx",)
        ):  # only an ONNX graph may take no input
            raise ValueError("input is an InputSpec or a tuple of InputSpec")
        if self.containers and (self.frameworks != ("onnx",) or set(self.containers) - {"inputs", "outputs"}):
            raise ValueError(
                "containers declare an ONNX graph's sequences and optionals: {'inputs': ..., 'outputs': ...}"
            )
        names = [i.name for i in self.model_inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names must be unique: {names}")
        for i in self.model_inputs:
            unsized = [d for d in i.shape if isinstance(d, str) and d not in self.axes]
            if unsized:
                raise ValueError(
                    f"input {i.name!r} names axis {unsized[0]!r}, which axes does not size (axes={self.axes})"
                )
            if len(self.model_inputs) > 1 and i.layout not in ("flat", "native", "tokens"):
                raise ValueError(f"input {i.name!r}: layout {i.layout!r} is for a single-input model")
        bad = {k: v for k, v in self.axes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
        if bad:
            raise ValueError(f"axes sizes must be positive integers: {bad}")
        known = {BATCH, *self.axes}
        for shape in self.verify_shapes or ():
            if (
                not isinstance(shape, dict)
                or any(k not in known for k in shape)
                or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in shape.values())
            ):
                raise ValueError(
                    f"verify_shapes entry {shape!r} is not {{axis: positive size}} over the axes {sorted(known)}"
                )
        for precision in list(self.tolerances) + list(self.grad_tolerances):
            if precision not in PRECISIONS:
                raise ValueError(f"unknown precision {precision!r} in tolerances; known: {PRECISIONS}")
        if "fp32" not in self.tolerances or "fp32" not in self.grad_tolerances:
            raise ValueError("tolerances and grad_tolerances need an 'fp32' entry")
        floored = [p for p, t in self.tolerances.items() if t.floor and p != "fp32"]
        floored += [f"gradients {p}" for p, t in self.grad_tolerances.items() if t.floor]
        if floored:
            raise ValueError(f"floor= derives fp32 output tolerances only, not {', '.join(floored)}")
        if any(not (math.isfinite(t.floor) and t.floor >= 0) for t in self.tolerances.values()):
            raise ValueError("floor= is a factor of the float32 noise floor: a finite positive number")
        if not self.weights_from_model and any(t.floor for t in self.tolerances.values()):
            raise ValueError(
                "floor= needs a model brought with parity init (weights_from_model=True): only its golden build "
                "measures the float32 noise floor"
            )
        if any(not isinstance(b, int) or b < 1 for b in self.timed_batch_sizes):
            raise ValueError(f"bench_batch_sizes must be positive integers, not {self.bench_batch_sizes!r}")
        if len(set(self.taps)) != len(self.taps):
            raise ValueError("tap names must be unique")
        for tap, layer in self.layers.items():
            if tap not in self.taps:
                raise ValueError(f"layers names {tap!r}, which is not a tap")
            unknown = [name for name in layer.inputs if name != MODEL_INPUT and name not in self.taps]
            if unknown:
                raise ValueError(f"layer {tap!r} reads {', '.join(unknown)}, which are not taps")
        if not self.frameworks:
            raise ValueError("define at least one of torch_module, keras_model, jax_apply, onnx_model")
        if self.loss is not None and self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is not one of {LOSSES} (or None: no gradients)")
        if not self.weights_from_model:
            if "onnx" in self.frameworks:
                raise ValueError("an ONNX source model takes its weights from the file: set weights_from_model=True")
            if not self.params or self.num_classes < 1:
                raise ValueError(
                    "a model trained by parity declares params and num_classes (or set "
                    "weights_from_model=True to take the weights from the model)"
                )
        elif len(self.frameworks) != 1:
            raise ValueError(
                "a model whose weights come from the model defines exactly one builder "
                f"(it defines {', '.join(self.frameworks)})"
            )
