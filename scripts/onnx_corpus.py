#!/usr/bin/env python
"""ONNX's own backend test cases as a proving ground: does parity take every case ONNX Runtime can load, and does
its verdict agree with ONNX Runtime's own against the expected outputs?

The cases are those the ``onnx`` package ships: its node cases, written to disk as ONNX writes them
(``model.onnx`` and ``test_data_set_N/{input,output}_i.pb``), and the ``pytorch-converted``, ``pytorch-operator``
and ``simple`` folders. For each case (a seeded sample, or ``--all``):

- ONNX Runtime's own verdict: every test data set run by an ``InferenceSession`` (all optimisations, CPU)
  against the expected outputs with the backend tests' tolerances (rtol 1e-3, atol 1e-7); a case ONNX Runtime
  cannot load is counted apart (``ort cannot load``) and tried again converted to opset 13;
- parity, as a user runs it: ``parity init CASE --onnx model.onnx --test-data DIR`` (``--opset 13`` for the
  converted try), ``golden build``, ``check --path onnx/ort``: taken (a verdict) or refused (the one-line reason);
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


def write_node_cases(out: Path) -> list[Path]:
    """The node cases as ``onnx.backend.test.cmd_tools generate-data`` writes cases: model and data sets."""
    import warnings

    import numpy as np
    from onnx import numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    written = []
    for case in cases:
        folder = out / "node" / case.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.onnx").write_bytes(case.model.SerializeToString())
        for k, (inputs, outputs) in enumerate(case.data_sets):
            data = folder / f"test_data_set_{k}"
            data.mkdir(exist_ok=True)
            for kind, values, infos in (("input", inputs, case.model.graph.input),
                                        ("output", outputs, case.model.graph.output)):
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


def ort_verdict(case: Path) -> tuple[str, str | None]:
    """ONNX Runtime's own verdict on the case's data sets: pass, fail (reason) or cannot load (reason)."""
    import numpy as np
    import onnxruntime as ort

    from parity.interop import onnx_test_data as interop

    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(case / "model.onnx"), options, providers=["CPUExecutionProvider"])
        sets = interop.read_test_data(case)
    except Exception as error:  # noqa: BLE001 - what ONNX Runtime (or the data) refuses
        return "cannot load", _short(error)
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    try:
        for s in sets:
            feed = dict(zip(names, s.inputs.values()))
            got = session.run(outputs, feed)
            for expected, actual in zip(s.outputs.values(), got):
                expected, actual = np.asarray(expected), np.asarray(actual)
                if expected.dtype.kind in "fc":
                    ok = actual.shape == expected.shape and np.allclose(actual, expected, rtol=RTOL, atol=ATOL,
                                                                        equal_nan=True)
                else:
                    ok = actual.shape == expected.shape and np.array_equal(actual, expected)
                if not ok:
                    return "fail", "outputs differ from the expected ones"
    except Exception as error:  # noqa: BLE001
        return "cannot load", f"run: {_short(error)}"
    return "pass", None


def _short(error) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text[:200]


def parity_verdict(case: Path, root: Path, opset: int | None = None) -> tuple[str, str | None]:
    """parity's ``onnx/ort`` verdict as a user gets it from the command line (in this process), or its refusal."""
    from click.testing import CliRunner

    from parity.cli import cli

    name = re.sub(r"\W", "_", case.name)[:60] + (f"_o{opset}" if opset else "")
    runner = CliRunner()
    init = ["init", name, "--onnx", str(case / "model.onnx"), "--test-data", str(case), "--workspace", str(root),
            "--force"] + (["--opset", str(opset)] if opset else [])
    for args in (init, ["golden", "build", "--model", name, "--workspace", str(root)]):
        result = runner.invoke(cli, args)
        if result.exit_code != 0:
            lines = (result.output or "").strip().splitlines() or [repr(result.exception)]
            return "refused", f"{args[0]}: {lines[-1]}"
    report = root / f"{name}.json"
    result = runner.invoke(cli, ["check", "--model", name, "--path", "onnx/ort", "--workspace", str(root),
                                 "--json", str(report)])
    if not report.exists():
        return "refused", f"check: {(result.output or '').strip().splitlines()[-1:]}"
    import json

    (entry,) = json.loads(report.read_text())["results"]
    return entry["verdict"], entry.get("reason")


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
    rows = []
    for index, case in enumerate(cases, 1):
        started = time.perf_counter()
        ort_says, ort_reason = ort_verdict(case)
        opset = None
        if ort_says == "cannot load":
            opset = 13  # what the refusal of an old opset tells a user to do
        says, reason = parity_verdict(case, out / "ws", opset)
        rows.append({"case": f"{case.parent.name}/{case.name}", "ort": ort_says, "ort_reason": ort_reason,
                     "parity": says, "reason": reason, "converted": opset is not None,
                     "seconds": time.perf_counter() - started})
        print(f"[{index}/{len(cases)}] {rows[-1]['case']}: ort {ort_says}, parity {says}", file=sys.stderr)
    report(rows)


def report(rows: list[dict]) -> None:
    loadable = [r for r in rows if r["ort"] != "cannot load"]
    taken = [r for r in loadable if r["parity"] in ("pass", "fail")]
    print(f"\n{len(rows)} cases; ONNX Runtime loads {len(loadable)}; parity takes {len(taken)} of them "
          f"({100 * len(taken) / max(len(loadable), 1):.1f} %)")
    refused = collections.Counter(reason_group(r["reason"]) for r in loadable if r["parity"] not in ("pass", "fail"))
    if refused:
        print("refused (cases ONNX Runtime loads), by reason:")
        for reason, count in refused.most_common():
            print(f"  {count:4d}  {reason}")
    agree = [r for r in taken if (r["parity"] == "pass") == (r["ort"] == "pass")]
    print(f"agreement with ONNX Runtime's own verdict on the cases taken: {len(agree)} of {len(taken)} "
          f"({100 * len(agree) / max(len(taken), 1):.1f} %)")
    for r in taken:
        if r not in agree:
            print(f"  differs: {r['case']}: ONNX Runtime {r['ort']}, parity {r['parity']}: {r['reason']}")
    converted = [r for r in rows if r["converted"]]
    if converted:
        taken_after = sum(1 for r in converted if r["parity"] in ("pass", "fail"))
        print(f"ONNX Runtime cannot load {len(converted)}: converted to opset 13, parity takes {taken_after}")
    seconds = [r["seconds"] for r in rows]
    print(f"cost per case: median {statistics.median(seconds):.2f} s, total {sum(seconds):.0f} s")


if __name__ == "__main__":
    main()
