"""The parts a ``ModelSpec`` is declared with, each checked as it is made: an input (``InputSpec``) and the values
of its golden data (``Values``), a weight (``ParamSpec``), what a tap computes (``Layer``), tolerances, the training
recipe, metric rules, the int8 accuracy gate and quantization; and the names each may take. Model files import them
from ``parity.model.spec``, beside ``ModelSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    ``parity.diagnose.causes.layers`` document each kind's attributes and variants). ``inputs`` are the
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
