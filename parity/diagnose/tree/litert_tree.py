"""One level of a Keras model's tree inside its ``.tflite`` file: which ops each layer path became, its output and
input tensors, and their values on LiteRT.

The TFLite converter names each op's output tensor by the TensorFlow name scopes of the ops it holds, ``;``-joined
where it fused several (``model_1/blocks_1/res_block_2_1/act_1/Gelu;...``): Keras 3 opens one scope per layer call,
so a layer path (``blocks/res_block_2/act``) is found as consecutive scope components, each the layer's name plus
as many ``_<n>`` as the model's own scope carries (``onnx_taps.keras_scope``, the rule tf2onnx's node names and
``litert.tap_map`` are read by: layer ``dense`` is scope ``dense_1``, layer ``dense_1`` scope ``dense_1_2``). An op
belongs to the layers its output tensor names; one whose output names none (a graph output, ``Identity``) to the one
layer its weights name, else, where it reads one tensor another op wrote (a softmax head's ``SOFTMAX``), to that
op's layers. A file whose exporter recorded no layer map (litert-torch's) is not read (``NotRead``). A layer's output is
the last tensor of its ops that an op outside them reads (or that is a graph output); its input, the first tensor its
ops read from outside (no weight) of the size of its reference input. Where that last op also holds a later layer of the
level (an activation folded into a ``FULLY_CONNECTED``'s fused activation), the earlier layer is ``fused`` into that op,
not read; the later one's input is then not observable. A layer called more than once is read at its first call:
its ops grouped by the name scope each call opened (``shared_1``, ``shared_3``), else by the tensors they hand each
other, the earliest group, when there are as many groups as calls (else it is unmapped, with why).

Keras is channels-last and so is the file: a 4-D tensor is put back into the canonical layout as the reference side
puts its values. A read is trusted as ``mapping_check.settle`` trusts an ONNX one: a tensor of another size is not
the layer's; one whose shape is another order of the layer's axes is taken only in an order its value proves; and
the walk withdraws a read its own downstream outputs contradict (``feeds_outputs``). The file runs twice, once as
the path runs it and once keeping every tensor (``experimental_preserve_all_tensors``); where the two disagree,
nothing read from the second is trusted. Imports ai_edge_litert inside.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from parity.diagnose.graph import instrument, mapping_check
from parity.diagnose.graph.onnx_taps import _permutes, keras_scope
from parity.diagnose.tree.graph_tree import components
from parity.model import layouts
from parity.runtimes.litert import scope_layer, scope_suffixes


class NotRead(ValueError):
    """Why the tree of a ``.tflite`` file is not read at all (its message is the reason)."""


class LiteRTLevels:
    """A path's ``.tflite`` file, run once on the golden feed as the path runs it (``plain``: its outputs by
    ``outputs``, the file's output names) and once keeping every tensor; each ``level`` call maps one level's layer
    paths to those tensors (the contract of ``graph_tree.GraphLevels``)."""

    def __init__(self, spec, path, artifact_dir, meta, x, threads):
        from parity.check.closeness import bitwise_equal
        from parity.runtimes import litert
        from parity.runtimes.onnx_common import onnx_feed

        if path.source != "tf" or "taps" not in meta:  # only a Keras model's converter names tensors by its layers
            why = meta.get("taps_reason") or "the exporter recorded no layer map for this .tflite file"
            raise NotRead(f"the tree of {path.id} is not read: {why}")
        self.spec, self.path, self.meta = spec, path, meta
        self.outputs = list(meta["output_names"])
        file = str(Path(artifact_dir) / meta["file"])
        feed = onnx_feed(spec, meta, x)
        self.plain = dict(zip(self.outputs, litert._invoke(_open(file, threads, False), meta, feed)))
        self.interpreter = _open(file, threads, True)
        kept = dict(zip(self.outputs, litert._invoke(self.interpreter, meta, feed)))
        tolerances = spec.output_tolerances(path.precision)
        by_file = dict(zip(self.outputs, spec.outputs))
        self.disturbed: str | None = None  # why nothing read from the tensor-keeping run is trusted
        self.differs: str | None = None  # a note that the two runs differ within tolerance
        if not instrument.same_outputs(self.plain, kept, lambda n: tolerances.for_name(by_file.get(n, n))):
            self.disturbed = (
                "the interpreter that keeps every tensor computes other outputs than the path's plain "
                "interpreter: its tensors are not what the path computes"
            )
        else:
            same, differ = bitwise_equal(self.plain, kept)
            if not same:
                self.differs = (
                    f"read on an interpreter that keeps every tensor, whose outputs differ from the plain "
                    f"interpreter's by up to {differ:.3g}"
                )
        self.tensors = {int(d["index"]): d for d in self.interpreter.get_tensor_details()}
        listed = litert._ops(self.interpreter)
        if listed is None:
            raise NotRead(
                f"the tree of {path.id} is not read: this LiteRT interpreter lists no ops (no _get_ops_details), so "
                f"no layer's tensors can be found"
            )
        self.ops = [op for op in listed if op["op_name"] != litert.DELEGATE_OP]
        self.writer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = {}
        for k, op in enumerate(self.ops):
            for t in op["outputs"]:
                self.writer[int(t)] = k
            for t in op["inputs"]:
                if int(t) >= 0:
                    self.readers.setdefault(int(t), []).append(k)
        self.graph_outputs = {int(d["index"]) for d in self.interpreter.get_output_details()}
        self.graph_inputs = {int(d["index"]) for d in self.interpreter.get_input_details()}
        self.model_name = meta.get("keras_model_name")
        # top-level layers the exporter recorded as not being a model output: the ops after them are the model's own
        self.not_outputs = {n for n, record in (meta.get("taps") or {}).items() if not record.get("output")}
        canonical = spec.model_inputs[0].layout if spec.model_inputs else "flat"
        self.canonical, self.layout = canonical, layouts.activation_layout("tf", canonical)

    def level(self, names, calls, expected, expected_inputs) -> dict:
        """``{"values", "inputs", "located", "instrumentation"}`` for the layer paths ``names`` (network order);
        ``expected`` / ``expected_inputs``: the reference's values and inputs (sizes, axis orders)."""
        names = list(names)
        owners = self._all_owners(names)
        tolerances = self.spec.output_tolerances(self.path.precision)
        located, values, inputs = {}, {}, {}
        for name in names:
            where = self._locate(name, names, owners, calls.get(name, 1), expected_inputs.get(name))
            located[name] = where
            if where["found"] != "name":
                continue
            if self.disturbed:
                where.update(found="unobservable", reason=self.disturbed)
                continue
            if self.differs:
                where["reason"] = "; ".join(filter(None, (where.get("reason"), self.differs)))
            tol = tolerances.for_name(name)
            try:
                values[name] = self._settled(where, expected[name], tol)
            except ValueError as error:
                where.update(found="unmapped", reason=str(error))
                continue
            if where.get("input_tensor") and name in expected_inputs:
                read = {"tensor": where["input_tensor"], "index": where.pop("input_index")}
                try:
                    inputs[name] = self._settled(read, expected_inputs[name], tol)
                except ValueError:
                    where["input_tensor"] = None
                else:
                    if read.get("order"):
                        where["input_order"] = read["order"]
        for where in located.values():
            where.pop("index", None)
            where.pop("input_index", None)
        instrumentation = None
        if self.disturbed:
            disturbing = [{"tap": n, "tensor": w["tensor"]} for n, w in located.items() if w["found"] == "unobservable"]
            instrumentation = {"observable": [], "disturbing": disturbing, "runs": 2}
        return {"values": values, "inputs": inputs, "located": located, "instrumentation": instrumentation}

    def _all_owners(self, names: list[str]) -> list[list[str]]:
        """The layers of ``names`` each op belongs to (``_owners``); an op that names none and writes a graph output
        (``Identity``: the converter names a graph output by the function's output, losing the op's scope), from
        one tensor that another op writes (a ``Dense(activation="softmax")``'s ``SOFTMAX`` after its
        ``FULLY_CONNECTED``), belongs to the layers of that op, unless the exporter recorded one of them as no
        model output."""
        owners: list[list[str]] = []
        for op in self.ops:
            found = self._owners(op, names)
            if not found and any(int(t) in self.graph_outputs for t in op["outputs"]):
                fed = {int(t) for t in op["inputs"] if int(t) in self.writer}
                before = owners[self.writer[fed.pop()]] if len(fed) == 1 else []
                found = [] if set(before) & self.not_outputs else list(before)
            owners.append(found)
        return owners

    def _owners(self, op: dict, names: list[str]) -> list[str]:
        """The layers of ``names`` an op belongs to: those its output tensors name; where they name none, the one
        layer its weights (tensors no op writes) name."""
        found = {
            layer
            for t in op["outputs"]
            for location in self.tensors[int(t)]["name"].split(";")
            if (layer := keras_scope(location, names, self.model_name)) is not None
        }
        if not found:
            weights = {
                layer
                for t in op["inputs"]
                if int(t) >= 0 and int(t) not in self.writer and int(t) not in self.graph_inputs
                for location in self.tensors[int(t)]["name"].split(";")
                if (layer := keras_scope(location, names, self.model_name)) is not None
            }
            found = weights if len(weights) == 1 else set()
        return sorted(found, key=names.index)

    def _locate(self, name: str, names: list[str], owners: list[list[str]], calls: int, expected_input) -> dict:
        mine = [k for k, held in enumerate(owners) if name in held]
        if not mine:
            return {
                "found": "unmapped",
                "tensor": None,
                "reason": f"no op's output tensor in the .tflite graph names layer {name!r} (the converter removed it, "
                f"e.g. an identity at inference such as Dropout, or merged it into an op named after another layer)",
            }
        if calls > 1:
            groups = self._calls(mine, name, names)
            if len(groups) != calls:
                return {
                    "found": "unmapped",
                    "tensor": None,
                    "reason": f"called {calls} times, and its ops fall into {len(groups)} group(s) by their name "
                    f"scopes and the tensors they hand each other, not {calls}",
                }
            mine = groups[0]
        inside = set(mine)
        nodes = [[self._tensor_name(self.ops[k]["outputs"][0]), self.ops[k]["op_name"]] for k in mine]
        boundary = [
            int(t)
            for k in mine
            for t in self.ops[k]["outputs"]
            if int(t) in self.graph_outputs or any(r not in inside for r in self.readers.get(int(t), ()))
        ]
        if not boundary:
            return {"found": "unmapped", "tensor": None, "nodes": nodes, "reason": "no op outside it reads its ops"}
        index = boundary[-1]
        op = self.ops[self.writer[index]]
        later = [n for n in owners[self.writer[index]] if names.index(n) > names.index(name)]
        where: dict = {"tensor": self._tensor_name(index), "nodes": nodes, "feeds_outputs": self._feeds_outputs(index)}
        if later:
            return {
                **where,
                "found": "fused",
                "fused_into": f"the {op['op_name']} op of {later[-1]}",
                "reason": f"the converter fused layer {name!r} into the {op['op_name']} op of {later[-1]!r}: its "
                f"tensor holds {later[-1]!r}'s output",
            }
        where.update(found="name", index=index, input_tensor=None)
        earlier = any(n != name and names.index(n) < names.index(name) for k in mine for n in owners[k])
        if earlier:
            where["reason"] = "its first op also holds an earlier layer (fused): its own input is not observable"
        elif expected_input is not None:
            read = self._input(mine, inside, int(np.size(expected_input)))
            if read is not None:
                where.update(input_tensor=self._tensor_name(read), input_index=read)
        return where

    def _input(self, mine: list[int], inside: set[int], size: int) -> int | None:
        """The first tensor the ops ``mine`` read from outside (a graph input or another op's output, no weight)
        that holds ``size`` elements."""
        for k in mine:
            for t in self.ops[k]["inputs"]:
                t = int(t)
                if t < 0 or (t not in self.graph_inputs and (t not in self.writer or self.writer[t] in inside)):
                    continue
                if int(np.prod(self.tensors[t]["shape"])) == size:
                    return t
        return None

    def _settled(self, where: dict, golden: np.ndarray, tol) -> np.ndarray:
        """The tensor ``where["index"]`` in the golden's order, proven as ``mapping_check.settle`` proves a graph's
        read; ``ValueError`` with the reason where it is not the layer's value."""
        from parity.runtimes.litert import dequantized

        index = where.pop("index")
        value, why = dequantized(self.tensors[index], self.interpreter.get_tensor(index))
        if value is None:
            raise ValueError(why)
        if why:
            where["reason"] = "; ".join(filter(None, (where.get("reason"), why)))
        if value.ndim == 4:
            value = layouts.from_layout(value, self.canonical, self.layout)
        golden = np.asarray(golden)
        where["unproven"] = _permutes(value.shape, golden.shape)
        try:
            return mapping_check.settle(value, where, golden, tol)
        finally:
            if not where["unproven"]:
                where.pop("unproven")

    def _tensor_name(self, index) -> str:
        return str(self.tensors[int(index)]["name"])

    def _feeds_outputs(self, index: int) -> bool:
        """Whether a graph output is computed from tensor ``index``."""
        seen, pending = {index}, [index]
        while pending:
            t = pending.pop()
            if t in self.graph_outputs:
                return True
            for k in self.readers.get(t, ()):
                for out in self.ops[k]["outputs"]:
                    if int(out) not in seen:
                        seen.add(int(out))
                        pending.append(int(out))
        return False

    def _calls(self, mine: list[int], name: str, names: list[str]) -> list[list[int]]:
        """The ops ``mine`` of a layer called more than once, one group per call, the earliest first: by the name
        scope each call opened (``shared_1``, ``shared_3``), else (one scope for all) by connected groups."""
        scopes: dict[str, list[int]] = {}
        for k in mine:
            scope = self._call_scope(self.ops[k], name, names)
            scopes.setdefault(scope or "", []).append(k)
        if len(scopes) > 1 and "" not in scopes:
            return sorted(scopes.values(), key=min)
        return components(mine, lambda k: (r for t in self.ops[k]["outputs"] for r in self.readers.get(int(t), ())))

    def _call_scope(self, op: dict, name: str, names: list[str]) -> str | None:
        """The scope prefix of ``op``'s first location under layer ``name`` (``m_1/shared_3``): which call of the
        layer it is in."""
        last = name.rsplit("/", 1)[-1]
        for t in op["outputs"]:
            for location in self.tensors[int(t)]["name"].split(";"):
                if keras_scope(location, names, self.model_name) != name:
                    continue
                parts = location.split("/")[:-1]
                suffixes = scope_suffixes(parts[0], self.model_name)
                at = max((i for i, part in enumerate(parts) if scope_layer(part, (last,), suffixes)), default=None)
                if at is not None:
                    return "/".join(parts[: at + 1])
        return None


def _open(file: str, threads: int, preserve: bool):
    from ai_edge_litert import interpreter as litert

    with warnings.catch_warnings():  # its warning that keeping every tensor is for debugging: so it is used here
        warnings.simplefilter("ignore", UserWarning)
        interpreter = litert.Interpreter(
            model_path=file, num_threads=int(threads), experimental_preserve_all_tensors=preserve
        )
    interpreter.allocate_tensors()
    return interpreter
