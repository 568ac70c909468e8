"""LiteRT: a ``.tflite`` model run by ``ai_edge_litert``'s interpreter on the CPU, with its default delegate
(XNNPACK) as a deployment gets it.

Taps: a second interpreter on the same file keeps every intermediate tensor
(``experimental_preserve_all_tensors``, which disables the arena's memory reuse, so the timed interpreter does not
use it). The TFLite converter names each op's output tensor by the Keras layers whose ops it holds
(``mlp_1/dense1_1/MatMul;mlp_1/relu1_1/Relu;mlp_1/dense1_1/BiasAdd``); a layer is read at the last op that names
it (``tap_map``). In an int8 model (``tf/litert-int8``) such a tensor holds int8 values: a tap is read dequantized
with the tensor's own scale and zero point (what the int8 model computed, in real units), and an integer tensor
without a scale is reported unmapped with the reason.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from parity.check.closeness import bitwise_equal
from parity.model import layouts
from parity.runtimes.base import Runner, ShapeMismatch
from parity.runtimes.onnx_common import onnx_feed

DELEGATE_OP = "DELEGATE"  # a delegate's partition in the execution plan, in place of the ops it took
# ops that move values without computing new ones: a layer's op of another shape after them still holds its output
DATA_MOVEMENT = {"TRANSPOSE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS"}


class LiteRtRunner(Runner):
    """``litert``: ``ai_edge_litert.interpreter.Interpreter`` with ``num_threads`` aligned with the other runtimes and
    its default op resolver (builtin kernels, XNNPACK delegate applied where it takes the ops).

    ``artifact_dir / meta["file"]`` is the ``.tflite`` file; inputs by ``meta["input_names"]`` (a single image
    input in the artifact's layout), outputs by ``meta["output_names"]`` in the spec's order. An input whose
    ``shape_signature`` has dynamic dims is resized to the feed's shape (a fixed dim refuses other sizes)."""

    def __init__(
        self,
        spec,
        artifact_dir: Path,
        meta: dict,
        batch_size: int,
        threads: int,
        device: str = "cpu",
        precision: str = "fp32",
    ):
        super().__init__(spec, batch_size, "float32", device, precision)
        from ai_edge_litert import interpreter as litert

        self.litert = litert
        self.meta = meta
        self.model_path = str(Path(artifact_dir) / meta["file"])
        self.threads = int(threads)
        self.interpreter = self._open(preserve=False)
        self._tap_interpreter = None  # made by the first ``taps``
        self.delegation = delegation(self.interpreter)
        self.numerics = {
            "ai_edge_litert": _version(),
            "device": "cpu",
            "precision": precision,
            "op_resolver": "AUTO",
            "delegate": self.delegation,
            "threads": self.threads,
        }

    def _open(self, preserve: bool):
        with warnings.catch_warnings():  # its warning that keeping every tensor is for debugging: so it is used here
            warnings.simplefilter("ignore", UserWarning)
            interpreter = self.litert.Interpreter(
                model_path=self.model_path, num_threads=self.threads, experimental_preserve_all_tensors=preserve
            )
        interpreter.allocate_tensors()
        return interpreter

    def run_impl(self, x):
        return _invoke(self.interpreter, self.meta, onnx_feed(self.spec, self.meta, x))

    def runtime_record(self) -> dict:
        """The LiteRT version, the op resolver, whether the XNNPACK delegate took ops (and how many partitions it
        made), the threads, and which inputs are dynamic in the file."""
        dynamic = [
            d["name"] for d in self.interpreter.get_input_details() if any(int(s) < 0 for s in d["shape_signature"])
        ]
        delegate = self.delegation or {}
        summary = (
            f"XNNPACK delegate applied ({delegate.get('partitions')} partitions)"
            if delegate.get("applied")
            else "no delegate: every op on LiteRT's builtin kernels"
        )
        return {
            "runtime": "litert",
            "ai_edge_litert": _version(),
            "device": "cpu",
            "op_resolver": "AUTO",
            "delegate": self.delegation,
            "threads": self.threads,
            "dynamic_inputs": dynamic,
            "artifact": self.meta.get("format"),
            "summary": f"{summary}, {self.threads} threads",
        }

    def taps_impl(self, x):
        """Each tap read from the tensor ``tap_map`` finds for it, in canonical layout, on an interpreter that keeps
        every tensor; ``tap_locations`` says where each was read, or why it was not."""
        located = tap_map(self.spec, self.meta, self.interpreter)
        self.tap_locations = {
            tap: {k: v for k, v in where.items() if k not in ("index", "layout")} for tap, where in located.items()
        }
        found = {tap: where for tap, where in located.items() if where["found"] == "name"}
        if not found:
            return {}
        if self._tap_interpreter is None:
            self._tap_interpreter = self._open(preserve=True)
        feed = onnx_feed(self.spec, self.meta, x)
        outputs = _invoke(self._tap_interpreter, self.meta, feed)
        same, differ = bitwise_equal(
            dict(enumerate(_invoke(self.interpreter, self.meta, feed))), dict(enumerate(outputs))
        )
        taps = {}
        details = {d["index"]: d for d in self._tap_interpreter.get_tensor_details()}
        for tap, where in found.items():
            value, why = dequantized(details[where["index"]], self._tap_interpreter.get_tensor(where["index"]))
            if value is None:  # an integer tensor whose scale is unknown holds no layer value: said, not read
                self.tap_locations[tap] = {**self.tap_locations[tap], "found": "unmapped", "reason": why}
                continue
            if why:
                self.tap_locations[tap]["reason"] = "; ".join(
                    filter(None, (self.tap_locations[tap].get("reason"), why))
                )
            if where.get("layout") == "nhwc" and value.ndim == 4:
                value = layouts.from_layout(value, self.meta["canonical_layout"], "nhwc")
            taps[tap] = value
            if not same:  # what the taps interpreter computed is not what the timed one did: said beside each tap
                self.tap_locations[tap]["reason"] = (
                    f"read on an interpreter that keeps every tensor, whose outputs "
                    f"differ from the plain interpreter's by up to {differ:.3g}"
                )
        return taps


def dequantized(detail: dict, value) -> tuple[np.ndarray | None, str | None]:
    """``(value, note)``: a float tensor as it is; an int8 / int16 / uint8 tensor of a quantized model as the real
    values it stands for, ``(q - zero_point) * scale`` with its per-tensor (or per-axis) scale, and a note saying so;
    ``(None, why)`` for an integer tensor without a scale."""
    value = np.array(value)
    if value.dtype.kind == "f":
        return value, None
    params = detail.get("quantization_parameters") or {}
    scales, zero_points = np.asarray(params.get("scales", ())), np.asarray(params.get("zero_points", ()))
    if not scales.size:
        return None, (
            f"tensor {detail['name']!r} holds {value.dtype} values without a quantization scale: not a layer's value"
        )
    if scales.size > 1:  # per-axis scales along quantized_dimension
        shape = [1] * value.ndim
        shape[int(params.get("quantized_dimension", 0))] = scales.size
        scales, zero_points = scales.reshape(shape), zero_points.reshape(shape)
    real = (value.astype(np.float64) - zero_points) * scales
    return real.astype(np.float32), (
        f"read from the {value.dtype} tensor of the quantized model, dequantized with "
        f"its scale ({float(np.max(scales)):.3g}) and zero point"
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return "unknown"


def delegation(interpreter) -> dict:
    """Whether a delegate took ops into its partitions (``DELEGATE`` nodes in the execution plan); ``applied`` None
    where this interpreter does not list its ops."""
    ops = _ops(interpreter)
    if ops is None:
        return {"name": "XNNPACK", "applied": None, "reason": "this interpreter does not list its ops"}
    partitions = sum(op["op_name"] == DELEGATE_OP for op in ops)
    return {
        "name": "XNNPACK",
        "applied": partitions > 0,
        "partitions": partitions,
        "graph_ops": sum(op["op_name"] != DELEGATE_OP for op in ops),
    }


def _ops(interpreter) -> list[dict] | None:
    get = getattr(interpreter, "_get_ops_details", None)  # the interpreter's only listing of its ops
    return list(get()) if get else None


def _invoke(interpreter, meta: dict, feed: dict) -> tuple:
    """Resize where a feed's shape differs (dynamic dims only: ``strict``), allocate, set, invoke, copy the outputs
    out in ``meta["output_names"]``'s order."""
    details = {d["name"]: d for d in interpreter.get_input_details()}
    resized = False
    for name, value in feed.items():
        detail = details.get(name)
        if detail is None:
            raise ShapeMismatch(f"the .tflite model has no input {name!r} (it has {', '.join(details)})")
        if tuple(detail["shape"]) != tuple(value.shape):
            signature = tuple(int(s) for s in detail["shape_signature"])
            fixed = [
                f"dimension {k} is {s}" for k, (s, v) in enumerate(zip(signature, value.shape)) if s >= 0 and s != v
            ]
            if len(signature) != value.ndim or fixed:
                raise ShapeMismatch(
                    f"input {name!r} of the .tflite model has shape {_shown(signature)} "
                    f"({'; '.join(fixed) or f'rank {len(signature)}'}); it was given {tuple(value.shape)}"
                )
            interpreter.resize_tensor_input(detail["index"], list(value.shape), strict=True)
            resized = True
    if resized:
        interpreter.allocate_tensors()
    for name, value in feed.items():
        detail = details[name]
        interpreter.set_tensor(detail["index"], _as_input(value, detail["dtype"], name))
    interpreter.invoke()
    by_name = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    return tuple(np.array(interpreter.get_tensor(by_name[name])) for name in meta["output_names"])


def _as_input(value: np.ndarray, dtype, name: str) -> np.ndarray:
    """``value`` in the input tensor's dtype: integers narrowed only where every value fits."""
    dtype = np.dtype(dtype)
    if value.dtype == dtype:
        return np.ascontiguousarray(value)
    if value.dtype.kind in "iub" and dtype.kind in "iub":
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        if info is not None and value.size and (value.min() < info.min or value.max() > info.max):
            raise ShapeMismatch(f"input {name!r} holds values outside the .tflite model's {dtype} input")
        return np.ascontiguousarray(value.astype(dtype))
    if value.dtype.kind == "f" and dtype.kind == "f":
        return np.ascontiguousarray(value.astype(dtype))
    raise ShapeMismatch(f"input {name!r} is {value.dtype}; the .tflite model takes {dtype}")


def _shown(signature: tuple) -> str:
    return "(" + ", ".join("?" if s < 0 else str(s) for s in signature) + ")"


def tap_map(spec, meta: dict, interpreter) -> dict[str, dict]:
    """Tap -> ``{"found": "name" | "fused" | "unmapped", "tensor", "fused_into"?, "reason"?, "index", "layout"}``.

    A tap that is a model output (``meta["taps"][tap]["output"]``) is read at that output tensor. Otherwise its layer
    is read at the last op (in execution order) whose output tensor names the layer: when that name also holds a
    later tap's layer, the converter fused the layer into that op (``fused``: that tensor holds the later tap's
    value, not this one's); else the tensor must have the layer's Keras output shape (``meta["taps"]``), or be a
    transpose / reshape after the layer's op of that shape (the layer is read there). A tensor of another shape is
    ``unmapped`` with the shapes: a wrong value is worse than none."""
    taps = list(spec.taps)
    if "taps" not in meta:  # an exporter that records no layers (litert-torch) says why
        why = meta.get("taps_reason") or "the exporter recorded no layer map for this .tflite file"
        return {tap: {"found": "unmapped", "reason": why} for tap in taps}
    records = meta["taps"]
    tensors = {d["index"]: d for d in interpreter.get_tensor_details()}
    ops = [op for op in (_ops(interpreter) or []) if op["op_name"] != DELEGATE_OP]
    outputs = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    tflite_outputs = meta.get("tflite_outputs") or dict(zip(spec.outputs, meta["output_names"]))
    written = [(op["op_name"], int(t)) for op in ops for t in op["outputs"] if int(t) in tensors]
    model_scope = meta.get("keras_model_name")
    named = [(op_name, index, tensor_layers(tensors[index]["name"], taps, model_scope)) for op_name, index in written]
    result: dict[str, dict[str, Any]] = {}
    for tap in taps:
        record = records.get(tap) or {}
        if record.get("shape") is None and not record.get("output"):
            why = record.get("reason") or "the layer returns several tensors or its output shape is unknown"
            result[tap] = {"found": "unmapped", "reason": f"no single output to read: {why}"}
            continue
        output = tflite_outputs.get(record.get("output")) if record.get("output") else None
        if output in outputs:
            result[tap] = {"found": "name", "tensor": output, "index": outputs[output], "layout": record.get("layout")}
            continue
        mentions = [k for k, (_, _, layers) in enumerate(named) if tap in layers]
        if not mentions:
            result[tap] = {
                "found": "unmapped",
                "reason": f"no op's output tensor in the .tflite graph names layer {tap!r} (the converter "
                f"removed it, e.g. an identity at inference such as Dropout, or merged it into "
                f"an op named after another layer)",
            }
            continue
        last = mentions[-1]
        op_name, index, layers = named[last]
        owner = max(layers, key=taps.index)
        if owner != tap:
            result[tap] = {
                "found": "fused",
                "tensor": tensors[index]["name"],
                "fused_into": owner,
                "reason": f"the converter fused layer {tap!r} into the {op_name} op of {owner!r}: its "
                f"tensor holds {owner!r}'s output",
            }
            continue
        expected = tuple(record["shape"])
        chosen = next((k for k in reversed(mentions) if _fits(_signature(tensors[named[k][1]]), expected)), None)
        moved = chosen is not None and all(
            named[k][0] in DATA_MOVEMENT and max(named[k][2], key=taps.index) == tap for k in mentions if k > chosen
        )
        if chosen is not None and (chosen == last or moved):
            _, index, _ = named[chosen]
            result[tap] = {
                "found": "name",
                "tensor": tensors[index]["name"],
                "index": index,
                "layout": record.get("layout"),
            }
            if chosen != last:
                result[tap]["reason"] = (
                    f"read before the {op_name} that follows it and carries its name, which "
                    f"writes another shape {_shown(_signature(tensors[named[last][1]]))}"
                )
            continue
        result[tap] = {
            "found": "unmapped",
            "tensor": tensors[index]["name"],
            "reason": f"the last op naming layer {tap!r} ({op_name}) writes shape "
            f"{_shown(_signature(tensors[index]))}; the layer's output is "
            f"{_shown(tuple(-1 if d is None else d for d in expected))}",
        }
    return result


def _signature(detail: dict) -> tuple[int, ...]:
    """A tensor's shape as the file declares it (-1 where dynamic), not as the last resize allocated it."""
    dims = detail.get("shape_signature")
    return tuple(int(d) for d in (detail["shape"] if dims is None or not len(dims) else dims))


def _fits(signature: tuple, expected: tuple) -> bool:
    """Whether a tensor's signature can hold the layer's Keras output shape (None / -1: any size)."""
    return len(signature) == len(expected) and all(s < 0 or e is None or s == e for s, e in zip(signature, expected))


def tensor_layers(tensor_name: str, taps: list[str], model_name: str | None = None) -> set[str]:
    """The taps whose Keras layer a converter tensor name holds ops of: each ``;``-separated location is
    ``<model scope>/<layer scope>/...``, each scope the name with as many ``_<n>`` suffixes as the model's scope
    carries beyond ``model_name`` (``scope_layer``)."""
    found = set()
    for location in tensor_name.split(";"):
        parts = location.split("/")
        if len(parts) < 3:  # an op directly under the model (or a bare name such as ``Identity``) names no layer
            continue
        layer = scope_layer(parts[1], taps, scope_suffixes(parts[0], model_name))
        if layer is not None:
            found.add(layer)
    return found


def scope_bases(component: str) -> list[str]:
    """A scope component, then it with one ``_<digits>`` stripped at a time: ``dense_2_1`` -> ``dense_2``, ``dense``."""
    bases = [component]
    while (stripped := re.sub(r"_\d+$", "", bases[-1])) != bases[-1]:
        bases.append(stripped)
    return bases


def scope_suffixes(model_scope: str, model_name: str | None) -> int:
    """How many ``_<n>`` suffixes each name scope of a converted Keras model carries: as many as the model's own
    scope (``functional_1_1``) carries beyond the model's name (``functional_1``); one where the name is not known
    (Keras 3 under ``tf.function`` opens each layer's scope a second time: layer ``dense`` is scope ``dense_1``)."""
    bases = scope_bases(model_scope)
    return bases.index(model_name) if model_name in bases else 1


def scope_layer(scope: str, names, suffixes: int) -> str | None:
    """The one of ``names`` a layer scope belongs to: the scope with exactly ``suffixes`` ``_<n>`` suffixes stripped.
    Keras's default names end in digits too, so no other count is tried: with one suffix, scope ``dense_1`` is
    layer ``dense``'s and ``dense_1_2`` layer ``dense_1``'s, whatever else ``names`` holds."""
    bases = scope_bases(scope)
    return bases[suffixes] if suffixes < len(bases) and bases[suffixes] in names else None
