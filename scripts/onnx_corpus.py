#!/usr/bin/env python
"""ONNX's own backend test cases as a proving ground: does parity take every case ONNX Runtime can load, and does
its verdict agree with ONNX Runtime's own against the expected outputs?

The cases are those the ``onnx`` package ships: its node cases, written to disk as ONNX writes them
(``model.onnx`` and ``test_data_set_N/{input,output}_i.pb``), and the ``pytorch-converted``, ``pytorch-operator``
and ``simple`` folders. For each case (a seeded sample, or ``--all``):

- ONNX Runtime's own verdict: every test data set run by an ``InferenceSession`` (all optimisations, CPU)
  against the expected outputs with the backend tests' tolerances (rtol 1e-3, atol 1e-7); a case ONNX Runtime
  cannot load is counted apart (``ort cannot load``) and tried again converted to opset 13;
- parity, as a user runs it: ``parity check-onnx`` over every case in one session (its library call,
  ``parity.pipeline.check_onnx.check``: each case's init with its test data, ``--opset 13`` for the converted try,
  golden build and check of ``onnx/ort``): taken (a verdict) or refused (the step and its one-line reason);
- agreement: parity's ``onnx/ort`` verdict against ONNX Runtime's own.

It prints taken / refused by reason, the agreement (and every disagreement), and the cost per case.

    python scripts/onnx_corpus.py [--sample 336] [--seed 0] [--all] [--cases test_add,test_matmul_2d]
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

RTOL, ATOL = 1e-3, 1e-7  # onnx.backend.test's defaults
FOLDERS = ("pytorch-converted", "pytorch-operator", "simple")


def write_node_cases(out: Path, names=None) -> list[Path]:
    """The node cases as ``onnx.backend.test.cmd_tools generate-data`` writes cases: model and data sets (only those
    ``names`` where given)."""
    import warnings

    import numpy as np
    from onnx import numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    written = []
    for case in cases:
        if names is not None and case.name not in names:
            continue
        folder = out / "node" / case.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.onnx").write_bytes(case.model.SerializeToString())
        for k, (inputs, outputs) in enumerate(case.data_sets):
            data = folder / f"test_data_set_{k}"
            data.mkdir(exist_ok=True)
            for kind, values, infos in (
                ("input", inputs, case.model.graph.input),
                ("output", outputs, case.model.graph.output),
            ):
                for j, value in enumerate(values):
                    info = infos[j]
                    if info.type.HasField("sequence_type"):
                        proto = numpy_helper.from_list(value, info.name)
                    elif info.type.HasField("optional_type"):
                        proto = numpy_helper.from_optional(value, info.name)
                    elif info.type.HasField("map_type"):
                        proto = numpy_helper.from_dict(value, info.name)
                    elif hasattr(value, "SerializeToString"):
                        proto = value
                    else:
                        proto = numpy_helper.from_array(np.asarray(value), info.name)
                    (data / f"{kind}_{j}.pb").write_bytes(proto.SerializeToString())
        written.append(folder)
    return written


def corpus(out: Path) -> list[Path]:
    import onnx

    shipped = Path(onnx.__file__).parent / "backend" / "test" / "data"
    cases = write_node_cases(out)
    for folder in FOLDERS:
        cases += sorted(p for p in (shipped / folder).iterdir() if (p / "model.onnx").is_file())
    return cases


def read_case_data(case: Path, model) -> list[tuple[dict, list]]:
    """Each data set of a case as onnx's backend runner reads it, independently of parity: ``(inputs by graph
    name, expected outputs in graph order)``, every file parsed by the type its graph slot declares (tensor,
    sequence, optional, map)."""
    from onnx import MapProto, OptionalProto, SequenceProto, TensorProto, numpy_helper

    parsers = {
        "sequence_type": (SequenceProto, numpy_helper.to_list),
        "optional_type": (OptionalProto, numpy_helper.to_optional),
        "map_type": (MapProto, numpy_helper.to_dict),
    }
    constants = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in constants]
    sets = []
    for folder in sorted(
        (p for p in case.iterdir() if p.name.startswith("test_data_set_")), key=lambda p: int(p.name.rsplit("_", 1)[1])
    ):
        values = {}
        for kind, slots in (("input", inputs), ("output", list(model.graph.output))):
            values[kind] = []
            for j, slot in enumerate(slots):
                file = folder / f"{kind}_{j}.pb"
                if not file.is_file():
                    continue
                proto_class, convert = parsers.get(slot.type.WhichOneof("value"), (TensorProto, numpy_helper.to_array))
                proto = proto_class()
                proto.ParseFromString(file.read_bytes())
                values[kind].append((slot.name, convert(proto)))
        sets.append((dict(values["input"]), [value for _, value in values["output"]]))
    return sets


def ort_verdict(case: Path) -> tuple[str, str | None]:
    """ONNX Runtime's own verdict on the case's data sets: pass, fail (reason) or cannot load (reason)."""
    import onnx
    import onnxruntime as ort

    try:
        model = onnx.load(str(case / "model.onnx"))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(case / "model.onnx"), options, providers=["CPUExecutionProvider"])
        sets = read_case_data(case, model)
    except Exception as error:  # noqa: BLE001 - what ONNX Runtime (or the data) refuses
        return "cannot load", _short(error)
    outputs = [o.name for o in session.get_outputs()]
    try:
        for feed, expected in sets:
            got = run_session(session, outputs, feed)
            for want, actual in zip(expected, got):
                if not same(want, actual):
                    return "fail", "outputs differ from the expected ones"
    except Exception as error:  # noqa: BLE001
        return "cannot load", f"run: {_short(error)}"
    return "pass", None


# ONNX element types whose arrays ONNX Runtime's NumPy API neither takes nor returns (bfloat16, the float8s, uint4,
# int4, float4e2m1, float8e8m0), and those of them packed two to a byte
ML_DTYPES_ELEMENTS, PACKED_ELEMENTS = frozenset({16, *range(17, 25)}), frozenset({21, 22, 23})


def run_session(session, outputs: list[str], feed: dict) -> list:
    """``session.run``; where an input or output is of a type ONNX Runtime's NumPy API cannot carry (bfloat16, float8,
    4-bit), the run goes through OrtValues holding the bytes ONNX itself serialises such a tensor to
    (``numpy_helper.from_array`` / ``to_array``), independently of parity's own conversion."""
    import ctypes

    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    types = [arg.type for arg in (*session.get_inputs(), *session.get_outputs())]
    if not any(any(k in (t or "") for k in ("bfloat16", "float8", "int4", "float4")) for t in types):
        return session.run(outputs, feed)

    def to_ortvalue(value):
        value = np.asarray(value)
        proto = numpy_helper.from_array(value)
        if proto.data_type not in ML_DTYPES_ELEMENTS:
            return ort.OrtValue.ortvalue_from_numpy(value)
        ortvalue = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), proto.data_type)
        if proto.raw_data:
            ctypes.memmove(ortvalue.data_ptr(), proto.raw_data, len(proto.raw_data))
        return ortvalue

    def from_ortvalue(ortvalue):
        element = ortvalue.element_type()
        if element not in ML_DTYPES_ELEMENTS:
            return ortvalue.numpy()
        count = int(np.prod(ortvalue.shape(), dtype=np.int64))
        size = (count + 1) // 2 if element in PACKED_ELEMENTS else count * (2 if element == 16 else 1)
        proto = TensorProto(data_type=element, dims=ortvalue.shape())
        proto.raw_data = ctypes.string_at(ortvalue.data_ptr(), size) if size else b""
        return numpy_helper.to_array(proto)

    results = session.run_with_ort_values(outputs, {name: to_ortvalue(value) for name, value in feed.items()})
    return [from_ortvalue(value) for value in results]


def same(expected, actual) -> bool:
    """The backend tests' closeness: floats (float16, bfloat16, float8 widened) by ``allclose`` at their rtol and
    atol, everything else (integers, bools, strings) equal; sequences element by element, optionals as their
    value or both empty."""
    import numpy as np

    if isinstance(expected, list) or isinstance(actual, list):
        return (
            isinstance(expected, list)
            and isinstance(actual, list)
            and len(expected) == len(actual)
            and all(same(e, a) for e, a in zip(expected, actual))
        )
    if expected is None or actual is None:
        return expected is None and actual is None
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        return False
    if _floating(expected):
        return bool(
            np.allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True)
        )
    if expected.dtype.kind in "OUS":
        return expected.astype(str).tolist() == actual.astype(str).tolist()
    return bool(np.array_equal(actual, expected))


def _floating(array) -> bool:
    return array.dtype.kind in "fc" or array.dtype.name.startswith(("bfloat16", "float8", "float4"))


def _short(error) -> str:
    """The error in one line of at most 200 characters, its file paths (ONNX Runtime names its own sources) cut to
    their last part and its C++ source locations dropped, so what is left is the reason."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    text = re.sub(r"/(?:[^/\s]+/)+([^/\s]+)", r"\1", text)
    return re.sub(r"\S+\.(?:cc|h):\d+ [\w:~<>]+\([^)]*\)\s*", "", text)[:200]  # ONNX Runtime's C++ location


def parity_verdict(case: Path, root: Path, opset: int | None = None, path: str = "onnx/ort") -> tuple[str, str | None]:
    """parity's verdict on ``path`` as a user gets it from ``parity check-onnx CASE`` (in this process), or its
    refusal."""
    says, reason, _ = parity_result(case, root, opset, path)
    return says, reason


def parity_result(
    case: Path, root: Path, opset: int | None = None, path: str = "onnx/ort"
) -> tuple[str, str | None, dict | None]:
    """``parity_verdict`` and the path's entry of the result JSON (None where the case was refused)."""
    (outcome,) = parity_session([case_of(case, opset)], root, path)
    return verdict_of(outcome)


def case_of(case: Path, opset: int | None = None):
    """A corpus case as ``parity check-onnx`` takes it: its ``model.onnx``, the test data beside it, the opset."""
    from parity.pipeline import check_onnx

    return check_onnx.case_of(case / "model.onnx", opset=opset)


def parity_session(cases: list, root: Path, path: str = "onnx/ort", on_case=None) -> list:
    """Every case through ``parity check-onnx``'s library call in one session (one workspace ``root``, one worker
    pool): each case's ``CaseOutcome``, in order; ``on_case`` hears each as it is done."""
    from parity.pipeline import check_onnx

    outcomes = []

    def done(outcome) -> None:
        outcomes.append(outcome)
        if on_case is not None:
            on_case(outcome)

    request = check_onnx.Request(patterns=(path,), workspace=str(root), force=True)
    check_onnx.check(cases, request, on_case=done)
    return outcomes


def verdict_of(outcome) -> tuple[str, str | None, dict | None]:
    """A case's verdict on its one path, its reason and the path's result entry; ``refused`` (with the step and
    the reason) where the case was refused, ``crashed`` where parity raised."""
    from parity.report.json_report import sanitize

    if outcome.error:
        return ("crashed" if outcome.crashed else "refused"), outcome.error, None
    if len(outcome.results) != 1:
        return "refused", f"check: {len(outcome.results)} results for one path", None
    (entry,) = sanitize(outcome.results)
    return entry["verdict"], entry.get("reason"), entry


def explain(case: Path, entry: dict | None) -> str:
    """Why parity's verdict differs from ONNX Runtime's own: ONNX Runtime's outputs measured against the expected
    ones under both policies (the backend tests' ``rtol 1e-3, atol 1e-7``; parity's tolerance for each output,
    from its result), so a tolerance policy is told apart from a disagreement on the values."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    if entry is None:
        return "parity refused the case"
    try:
        model = onnx.load(str(case / "model.onnx"))
        session = ort.InferenceSession(str(case / "model.onnx"), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        worst = {}
        for feed, expected in read_case_data(case, model):
            for name, want, got in zip(names, expected, run_session(session, names, feed)):
                want, got = np.asarray(want), np.asarray(got)
                if not _floating(want) or want.shape != got.shape:
                    continue
                want, got = want.astype(np.float64), got.astype(np.float64)
                stats = (entry.get("outputs") or {}).get(name) or {}
                declared = entry["tolerances"]["outputs"]
                tol = stats.get("tolerance") or declared["overrides"].get(name) or declared["default"]
                diff = np.abs(got - want)
                finite = np.isfinite(diff)
                backend = float(np.max(diff[finite] / (ATOL + RTOL * np.abs(want[finite])), initial=0.0))
                own = float(np.max(diff[finite] / (tol["atol"] + tol["rtol"] * np.abs(want[finite])), initial=0.0))
                if backend > worst.get(name, (0.0,))[0]:
                    worst[name] = (backend, own, float(np.max(diff[finite], initial=0.0)), tol, stats.get("tolerance"))
    except Exception as error:  # noqa: BLE001 - the explanation must never end the report
        return f"not explained ({_short(error)})"
    if not worst:
        return "not explained: no float output differs from the expected ones"
    name, (backend, own, max_abs, tol, rule) = max(worst.items(), key=lambda item: item[1][0])
    why = f"; {rule['why']}" if rule else ""
    return (
        f"tolerance policy: ONNX Runtime's {name} is off by max_abs {max_abs:.3g}, {backend:.3g}x the backend "
        f"tests' rtol {RTOL:g}, atol {ATOL:g} and {own:.3g}x parity's atol {tol['atol']:.3g}, rtol "
        f"{tol['rtol']:.3g}{why}"
    )


def reason_group(reason: str) -> str:
    """A refusal's reason without the case-specific names and numbers, to count alike ones together."""
    text = re.sub(r"'[^']*'", "'…'", reason or "")
    text = re.sub(r"/\S+", "PATH", text)
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", text)[:140]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=336, help="cases in the seeded sample (default 336)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all", action="store_true", help="every case instead of a sample")
    parser.add_argument("--cases", default="", help="comma-separated case names (overrides the sample)")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="parity-onnx-corpus-"))
    cases = corpus(out / "cases")
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c.name in wanted]
    elif not args.all:
        cases = random.Random(args.seed).sample(cases, min(args.sample, len(cases)))
    rows, taken = [], []
    for case in cases:  # ONNX Runtime's own verdict first: where it cannot load a case, parity takes it converted
        started = time.perf_counter()
        ort_says, ort_reason = ort_verdict(case)
        opset = 13 if ort_says == "cannot load" else None  # what the refusal of an old opset tells a user to do
        rows.append(
            {
                "case": f"{case.parent.name}/{case.name}",
                "ort": ort_says,
                "ort_reason": ort_reason,
                "converted": opset is not None,
                "seconds": time.perf_counter() - started,
            }
        )
        taken.append(case_of(case, opset))

    def on_case(outcome) -> None:
        row = rows[len(done)]
        done.append(outcome)
        row["parity"], row["reason"], row["entry"] = verdict_of(outcome)
        row["seconds"] += outcome.seconds
        print(f"[{len(done)}/{len(cases)}] {row['case']}: ort {row['ort']}, parity {row['parity']}", file=sys.stderr)

    done: list = []
    parity_session(taken, out / "ws", on_case=on_case)
    for case, row in zip(cases, rows):
        says, ort_says = row["parity"], row["ort"]
        if ort_says != "cannot load" and says in ("pass", "fail") and (says == "pass") != (ort_says == "pass"):
            started = time.perf_counter()
            row["explanation"] = explain(case, row["entry"])
            row["seconds"] += time.perf_counter() - started
    report(rows)


def report(rows: list[dict]) -> None:
    loadable = [r for r in rows if r["ort"] != "cannot load"]
    taken = [r for r in loadable if r["parity"] in ("pass", "fail")]
    print(
        f"\n{len(rows)} cases; ONNX Runtime loads {len(loadable)}; parity takes {len(taken)} of them "
        f"({100 * len(taken) / max(len(loadable), 1):.1f} %)"
    )
    refused = collections.Counter(reason_group(r["reason"]) for r in loadable if r["parity"] not in ("pass", "fail"))
    if refused:
        print("refused (cases ONNX Runtime loads), by reason:")
        for reason, count in refused.most_common():
            print(f"  {count:4d}  {reason}")
    agree = [r for r in taken if (r["parity"] == "pass") == (r["ort"] == "pass")]
    print(
        f"agreement with ONNX Runtime's own verdict on the cases taken: {len(agree)} of {len(taken)} "
        f"({100 * len(agree) / max(len(taken), 1):.1f} %)"
    )
    for r in taken:
        if r not in agree:
            reason = f": {r['reason']}" if r.get("reason") else ""  # a pass has none
            print(f"  differs: {r['case']}: ONNX Runtime {r['ort']}, parity {r['parity']}{reason}")
            print(f"    why: {r.get('explanation')}")
    crashed = [r for r in rows if r["parity"] == "crashed"]
    for r in crashed:
        print(f"  crashed: {r['case']}: {r['reason']}")
    cannot = collections.Counter(reason_group(r["ort_reason"]) for r in rows if r["ort"] == "cannot load")
    if cannot:
        print("ONNX Runtime cannot load, by its reason:")
        for reason, count in cannot.most_common():
            print(f"  {count:4d}  {reason}")
    converted = [r for r in rows if r["converted"]]
    if converted:
        taken_after = sum(1 for r in converted if r["parity"] in ("pass", "fail"))
        print(f"ONNX Runtime cannot load {len(converted)}: converted to opset 13, parity takes {taken_after}")
    seconds = [r["seconds"] for r in rows]
    print(f"cost per case: median {statistics.median(seconds):.2f} s, total {sum(seconds):.0f} s")


if __name__ == "__main__":
    main()
