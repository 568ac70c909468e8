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

from parity.model.values import LOW_PRECISION
from parity.platform.precision import PRECISIONS as precision_names

PRECISIONS = tuple(precision_names)
PARAM_KINDS = ("dense_kernel", "conv_kernel", "vector", "tensor")
PARAM_DTYPES = ("float32", "float64", "float16", "bfloat16")
INPUT_LAYOUTS = ("flat", "tokens", "nchw", "native")  # native: the source framework's own, never converted
LOSSES = ("cross_entropy",)
MODEL_INPUT = "input"  # in Layer.inputs: the model input rather than a tap
LAYER_KINDS = (
    "dense",
    "conv",
    "batch_norm",
    "layer_norm",
    "activation",
    "pool",
    "flatten",
    "attention",
    "dropout",
    "add",
    "position",
    "mean",
    "resize",
    "recurrent",
    "softmax",
    "rms_norm",
    "gated_mlp",
    "rotary",
)


@dataclass(frozen=True)
class Tolerance:
    """Closeness test ``|actual - golden| <= atol + rtol * |golden|`` (numpy.allclose semantics); ``scaled`` adds
    that fraction of the tensor's largest golden magnitude to every element's allowance (a bound relative to the
    tensor's scale, as float32 rounding is: the noise floor's bound, ``parity.check.noise_floor``)."""

    atol: float
    rtol: float
    scaled: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, **({"scaled": self.scaled} if self.scaled else {})}


@dataclass(frozen=True)
class Tolerances:
    """A default tolerance and per-name overrides (an output name or a parameter name).

    ``floor``: fp32 outputs only, derived from the model's float32 noise floor that ``parity golden build``
    measures: each measured output at ``floor`` times it, the overrides as declared, ``default`` where no floor
    could be measured (``parity.model.user.resolve_floor``, which a user model's golden data applies)."""

    default: Tolerance
    overrides: dict[str, Tolerance] = field(default_factory=dict)
    floor: float = 0.0

    def for_name(self, name: str) -> Tolerance:
        return self.overrides.get(name, self.default)

    def to_json(self) -> dict[str, Any]:
        return {
            "default": self.default.to_json(),
            "overrides": {k: v.to_json() for k, v in self.overrides.items()},
            **({"floor": self.floor} if self.floor else {}),
        }


INPUT_DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "str",  # str: an ONNX string tensor, held as NumPy unicode
    *LOW_PRECISION,
)  # float8, int4, uint4, float4 of an ONNX graph: golden data holds their raw bits
VALUE_KINDS = ("normal", "uniform", "integers", "mask", "fixed")
BATCH = "batch"  # the axis name of the leading batch axis (its size is the spec's batch size)


@dataclass(frozen=True)
class Values:
    """The value domain of an input's generated golden data.

    ``normal`` (``mean``, ``std``); ``uniform`` (``low`` to ``high``); ``integers`` (``low`` to ``high``,
    high excluded: token ids are ``Values("integers", high=VOCAB_SIZE)``); ``mask``: an attention mask of
    ones with a padded tail of zeros along the last axis (each row keeps at least one 1, and the first row
    none padded); ``fixed``: every element ``value``.
    """

    kind: str = "normal"
    low: float = 0.0
    high: float = 1.0
    mean: float = 0.0
    std: float = 1.0
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in VALUE_KINDS:
            raise ValueError(f"input values {self.kind!r} are not one of {VALUE_KINDS}")
        if self.kind == "integers" and int(self.high) - int(self.low) < 2:
            raise ValueError(
                f"integer values from {self.low:g} to {self.high:g} (excluded) take one value: declare "
                'the range the ids cover, e.g. Values("integers", high=VOCAB_SIZE)'
            )

    def describe(self) -> str:
        if self.kind == "normal":
            return f"normal(mean {self.mean:g}, std {self.std:g})"
        if self.kind == "fixed":
            return f"fixed {self.value:g}"
        if self.kind == "mask":
            return "attention mask (padded tails)"
        return f"{self.kind}[{self.low:g}, {self.high:g})"


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, per-sample shape in canonical layout, dtype, value domain.

    ``shape`` leaves out the leading batch axis (there is one unless ``batched=False``); an entry that is
    a string names a dynamic axis (``"sequence"``) whose golden size ``ModelSpec.axes`` gives. ``dtype``
    is one of ``INPUT_DTYPES``; ``values`` how generated golden data is drawn (default: the model's
    ``InputData``).
    """

    name: str
    shape: tuple[int | str, ...]
    layout: str = "flat"
    dtype: str = "float32"
    values: Values | None = None
    batched: bool = True

    def __post_init__(self) -> None:
        if self.layout not in INPUT_LAYOUTS:
            raise ValueError(f"input layout {self.layout!r} is not one of {INPUT_LAYOUTS}")
        if self.dtype not in INPUT_DTYPES:
            raise ValueError(f"input {self.name!r}: dtype {self.dtype!r} is not one of {INPUT_DTYPES}")
        for dim in self.shape:
            if not (isinstance(dim, str) and dim.isidentifier() and dim != BATCH) and not (
                isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0
            ):
                raise ValueError(
                    f"input {self.name!r}: shape {self.shape!r} has {dim!r}, neither a size nor an axis "
                    f"name (a Python identifier other than {BATCH!r}, which is implicit)"
                )

    @property
    def floating(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Every axis of the full shape by name: ``batch`` first where batched, sizes as ``""``."""
        sample = tuple(d if isinstance(d, str) else "" for d in self.shape)
        return ((BATCH,) if self.batched else ()) + sample

    def full_shape(self, batch_size: int, axes: dict[str, int]) -> tuple[int, ...]:
        """The concrete shape at ``batch_size`` and the named axes' sizes ``axes``."""
        sample = tuple(axes[d] if isinstance(d, str) else d for d in self.shape)
        return ((batch_size,) if self.batched else ()) + sample

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "batched": self.batched,
            "values": None if self.values is None else self.values.describe(),
        }


@dataclass(frozen=True)
class ParamSpec:
    """One weight tensor in canonical layout. ``trainable=False`` for BatchNorm statistics."""

    shape: tuple[int, ...]
    kind: str = "tensor"
    trainable: bool = True
    dtype: str = "float32"  # the model's own; golden data stores it as it is (bfloat16 widened to float32, exactly)

    def __post_init__(self) -> None:
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"parameter kind {self.kind!r} is not one of {PARAM_KINDS}")
        if self.dtype not in PARAM_DTYPES:
            raise ValueError(f"parameter dtype {self.dtype!r} is not one of {PARAM_DTYPES}")

    @property
    def stored_dtype(self) -> str:
        """The dtype of this weight in ``weights.npz`` (NumPy has no bfloat16)."""
        return "float32" if self.dtype == "bfloat16" else self.dtype


@dataclass(frozen=True)
class Layer:
    """What one tap computes, typed, so a diagnosis can recompute it in NumPy and test known variants.

    ``kind`` is one of ``LAYER_KINDS``; ``attrs`` its declared form (the modules in
    ``parity.diagnose.layers`` document each kind's attributes and variants). ``inputs`` are the
    taps feeding it (``"input"`` is the model input; default: the previous tap, or the model
    input for the first one); ``params`` is the prefix of its weights (default: the tap name).
    Activations are in canonical layout (``NCHW`` images). Examples::

        Layer("conv", {"stride": 2, "padding": "same"})   # 'same' splits padding as TF/XLA do
        Layer("layer_norm", {"eps": 1e-5})
        Layer("activation", {"form": "gelu_erf"})
        Layer("activation", {"form": "softplus", "beta": 2.0, "threshold": 1.0})   # torch's nn.Softplus(2, 1)
        Layer("softmax", {"axis": -1, "log": True})       # nn.LogSoftmax(dim=-1)
        Layer("add", inputs=("pos", "block0_attn"))
        Layer("attention", {"heads": 4, "mask": "ignore", "key_padding": True, "masked_rows": "nan"},
              inputs=("embed", "pad_mask"))               # nn.MultiheadAttention with a key_padding_mask
    """

    kind: str
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    params: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"layer kind {self.kind!r} is not one of {LAYER_KINDS}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "attrs": dict(self.attrs), "inputs": list(self.inputs), "params": self.params}


@dataclass(frozen=True)
class Training:
    """How the weights are made: seeded init of the torch definition, then Adam on the train split."""

    epochs: int = 20
    lr: float = 1e-2
    batch_size: int = 64
    weight_decay: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class MetricRules:
    """Metric parity rules, per precision.

    ``min_argmax_agreement``: the fraction of eval samples whose argmax must equal the golden
    argmax (1.0 at fp32 by default). ``min_fraction``: each metric must reach this fraction of
    its float64 golden value (MLPerf style, for reduced precision).
    """

    min_argmax_agreement: dict[str, float] = field(
        default_factory=lambda: {"fp32": 1.0, "tf32": 0.99, "fp16": 0.99, "bf16": 0.98}
    )
    min_fraction: dict[str, float] = field(
        default_factory=lambda: {"fp32": 1.0, "tf32": 0.99, "fp16": 0.99, "bf16": 0.99}
    )
    top_k: int = 3


@dataclass(frozen=True)
class Gate:
    """The accuracy gate a quantized (int8) path passes instead of elementwise tolerances (MLPerf's rule).

    The path passes when its ``metric`` on the labelled eval split keeps at least ``keep`` of the float64
    golden's, with ``confidence``: the one-sided bound of the drop (a paired test on the same samples) must
    stay within ``(1 - keep) * golden``. ``metric``: ``"accuracy"`` (needs labels) or ``"agreement"`` (the
    fraction of samples whose argmax is the golden's; a model without labels is gated by it).
    """

    metric: str = "accuracy"
    keep: float = 0.99
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.metric not in ("accuracy", "agreement"):
            raise ValueError(f"Gate metric {self.metric!r} is not 'accuracy' or 'agreement'")
        if not 0.0 < self.keep <= 1.0 or not 0.5 <= self.confidence < 1.0:
            raise ValueError(
                f"Gate keep must be in (0, 1] and confidence in [0.5, 1) (got keep={self.keep}, "
                f"confidence={self.confidence})"
            )


CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile")


@dataclass(frozen=True)
class Quantization:
    """How parity's int8 paths quantize the model.

    ``calibration``: how activation ranges are picked from the calibration samples (ONNX Runtime's
    ``CalibrationMethod``: MinMax, Entropy, Percentile; the other quantizers record their own).
    ``keep_float``: path glob -> the layers that path keeps in float, in its toolchain's own names (ONNX node
    names for ``*/ort-int8``, NNCF node names for ``*/openvino-int8``, TFLite tensor names for ``tf/litert-int8``,
    module paths for ``torch/pt2e-int8``): what an int8 repair writes, so the repaired model is an ordinary path.
    """

    calibration: str = "MinMax"
    keep_float: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.calibration not in CALIBRATION_METHODS:
            raise ValueError(f"calibration {self.calibration!r} is not one of {CALIBRATION_METHODS}")

    def kept_float(self, path_id: str) -> tuple[str, ...]:
        """The layers ``path_id`` keeps in float: every name of every glob it matches, in declared order."""
        import fnmatch

        names = [n for pattern, kept in self.keep_float.items() if fnmatch.fnmatchcase(path_id, pattern) for n in kept]
        return tuple(dict.fromkeys(names))


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
    training: Training = Training()
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
    metric_rules: MetricRules = MetricRules()
    gate: Gate = Gate()
    quantization: Quantization = Quantization()
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
