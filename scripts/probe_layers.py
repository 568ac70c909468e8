#!/usr/bin/env python
"""Single layers and ops of each framework through every CPU path parity offers, against a float64 reference.

Each case (a layer variant: RMSNorm with Gemma's ``1 + w``, a resize mode, an attention mask ...) is a one-input
model built in its framework (``scripts/probe_layers_torch.py``, ``probe_layers_keras.py``, ``probe_layers_jax.py``).
Its float64 reference is the framework's own model run in float64 (as ``parity golden build`` makes a golden); every
path then exports it with parity's own exporters (``parity.exporters``) and runs it with parity's own runtimes
(``parity.runtimes``), as ``parity check`` does. A cell is the worst element's error in units of the path's fp32
tolerance (the spec's default: atol 1e-5, rtol 1e-5): ``ok`` within it, ``DEPARTS xN`` beyond it, or the export's
or the runtime's error, or ``-`` where the framework has no such layer. A departure of a converted path is *real*
where the framework's own float32 run of the same layer stays within the tolerance (or departs far less).

Every framework runs in processes of its own (a float64 reference process, then a paths process), as parity's
workers do: TensorFlow, PyTorch and JAX never share one.

    python scripts/probe_layers.py [--layers rmsnorm,resize/*] [--paths torch/onnx/ort,tf/*] [--json out.json]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BATCH = 2
PATHS = {  # framework -> its CPU paths, native first
    "torch": ("torch", "torch/onnx/ort", "torch/openvino", "torch/executorch"),
    "tf": ("tf", "tf/xla", "tf/litert", "tf/onnx/ort"),
    "jax": ("jax", "jax/onnx/ort", "jax/tf"),
}
CASE_MODULES = {"torch": "probe_layers_torch", "tf": "probe_layers_keras", "jax": "probe_layers_jax"}
WORKER_TIMEOUT_S = 900
FLOAT32_MIN = float(np.finfo(np.float32).min)  # the mask value of a float32 model, its reference's too
UNIT = "unit"  # a weight of ones
REAL_FACTOR = 4.0  # a converted path departs for real where its error is this many times the native run's, or more


def normal(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def scaled(factor: float, offset: float = 0.0) -> Callable:
    """Normal values times ``factor`` plus ``offset``."""
    return lambda rng, shape: (rng.standard_normal(shape) * factor + offset).astype(np.float32)


def uniform(low: float, high: float) -> Callable:
    return lambda rng, shape: rng.uniform(low, high, shape).astype(np.float32)


def spread(low: float, high: float) -> Callable:
    """Evenly spread from ``low`` to ``high`` (the tails of an activation), shuffled across the tensor."""

    def make(rng, shape):
        values = np.linspace(low, high, int(np.prod(shape)))
        return rng.permutation(values).reshape(shape).astype(np.float32)

    return make


@dataclass(frozen=True)
class Case:
    """One layer variant in one framework: one sample's input ``shape``; ``make`` builds it (torch: ``() -> Module``;
    Keras: ``(dtype) -> keras.Model``; JAX: ``(params, x) -> y`` with ``params`` shapes by name); ``values`` draws its
    input at the full shape (batch first)."""

    shape: tuple
    make: Callable
    values: Callable = normal
    params: dict = field(default_factory=dict)


# --- in a worker process -------------------------------------------------------------------------------------------


def _weights(rng: np.random.Generator, shapes: dict) -> dict:
    """Seeded weights: normal, scaled down; a variance (BatchNorm's statistics) positive."""
    out = {}
    for name, shape in shapes.items():
        if name == UNIT:
            out[name] = np.ones(shape, np.float32)
        elif "var" in name.split("/")[-1].split(".")[-1]:
            out[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return out


def build_spec(framework: str, name: str, case: Case):
    """``(spec, weights, feeds)``: the case as a one-input, one-output parity model holding seeded weights."""
    from parity.model.spec import InputSpec, ModelSpec, ParamSpec

    rng = np.random.default_rng(_seed(name))
    if framework == "torch":
        module = case.make()
        shapes = {k: tuple(v.shape) for k, v in module.state_dict().items() if v.is_floating_point()}
        builders = {"torch_module": case.make}
    elif framework == "tf":
        model = case.make("float32")
        shapes = {v.path: tuple(v.shape) for v in model.weights if str(v.dtype).startswith("float")}
        builders = {"keras_model": case.make}
    elif case.params:
        shapes = dict(case.params)
        builders = {"jax_apply": lambda params, x, tap: case.make(params, x)}
    else:  # parity's JAX source needs a parameter to read: a unit factor, exact in every runtime
        shapes = {UNIT: (1,)}
        builders = {"jax_apply": lambda params, x, tap: case.make(params, x * params[UNIT])}
    spec = ModelSpec(
        name=name.replace("/", "_"),
        description=name,
        input=InputSpec("x", tuple(case.shape), layout="native"),
        outputs=("y",),
        params={k: ParamSpec(tuple(s)) for k, s in shapes.items()},
        weights_from_model=True,
        loss=None,
        batch_size=BATCH,
        verify_shapes=(),
        **builders,
    )
    spec.validate()
    weights = _weights(rng, shapes)
    feeds = {"x": case.values(rng, (BATCH, *case.shape))}
    return spec, weights, feeds


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _one_line(error: BaseException, limit: int = 200) -> str:
    """The innermost cause of ``error`` (a converter wraps its backend's) as ``Type: message`` on one line."""
    while error.__cause__ is not None and error.__cause__ is not error:
        error = error.__cause__
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", f"{type(error).__name__}: {error}").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_path(spec, weights: dict, feeds: dict, path_id: str, scratch: Path) -> dict:
    """The path's output on ``feeds`` (``{"y": array}``), or ``{"error": "export error: ..."}`` /
    ``{"error": "runtime error: ..."}``: exported step by step by parity's exporters, run by the path's runtime."""
    from parity.exporters.common import ExportJob
    from parity.exporters.onnx_names import check_exported
    from parity.run import paths
    from parity.run.tasks import build_runner

    path = paths.by_id(path_id)
    parent_dir, parent_meta = None, None
    try:
        for k, step in enumerate(path.exports):
            out = scratch / f"{path_id.replace('/', '_')}_{k}"
            out.mkdir(parents=True, exist_ok=True)
            job = ExportJob(
                spec=spec,
                weights=weights,
                batch_size=BATCH,
                opset=spec.opset,
                out_dir=out,
                parent_dir=parent_dir,
                parent_meta=parent_meta,
                inputs=feeds,
                path_id=path_id,
            )
            parent_meta = paths.load_target(step.target)(job)
            if parent_meta.get("format") == "onnx":
                check_exported(out / parent_meta["file"])
            parent_dir = out
    except Exception as error:  # noqa: BLE001 - the converter's refusal is the cell
        return {"error": f"export error: {_one_line(error)}"}
    try:
        runner = build_runner(spec, path, weights, BATCH, 1, parent_dir and str(parent_dir), parent_meta)
        return {"y": np.asarray(runner.run(feeds)["y"])}
    except Exception as error:  # noqa: BLE001 - the runtime's refusal is the cell
        return {"error": f"runtime error: {_one_line(error)}"}


def worker(framework: str, phase: str, layers: list[str], path_ids: list[str], store: Path) -> None:
    """The framework's cases that ``layers`` (names or globs) selects. ``phase`` ``ref``: each one's float64 reference into ``store/ref_<framework>.npz``; ``paths``: each path's
    verdict on each case into ``store/<framework>.json``."""
    import importlib

    from parity.check.closeness import error_stats
    from parity.run import paths

    sys.path.insert(0, str(HERE))
    cases = importlib.import_module(CASE_MODULES[framework]).CASES
    layers = [name for name in cases if _matches(name, layers)]
    if phase == "ref":
        refs = {}
        for name in layers:
            spec, weights, feeds = build_spec(framework, name, cases[name])
            try:
                native = paths.load_target(paths.by_id(framework).runtime_target)
                refs[name] = native(spec, weights, BATCH, "float64").run(feeds)["y"]
            except Exception as error:  # noqa: BLE001 - a case its framework cannot run in float64 is said
                print(f"{framework} {name}: no float64 reference ({_one_line(error)})", flush=True)
        np.savez(store / f"ref_{framework}.npz", **{k: np.asarray(v, np.float64) for k, v in refs.items()})
        return
    with np.load(store / f"ref_{framework}.npz") as data:
        refs = {k: data[k] for k in data.files}
    results: dict = {}
    scratch = Path(tempfile.mkdtemp(prefix=f"probe_{framework}_", dir=store))
    for name in layers:
        spec, weights, feeds = build_spec(framework, name, cases[name])
        tolerance = spec.output_tolerances("fp32").for_name("y")
        for path_id in path_ids:
            started = time.perf_counter()
            if name not in refs:
                cell = {"error": "no float64 reference"}
            else:
                got = run_path(spec, weights, feeds, path_id, scratch / _safe(name))
                cell = (
                    {"error": got["error"]}
                    if "error" in got
                    else _verdict(error_stats(got["y"], refs[name], tolerance))
                )
            cell["seconds"] = round(time.perf_counter() - started, 2)
            results.setdefault(name, {})[path_id] = cell
            print(f"{name:32s} {path_id:18s} {cell_text(cell)}", flush=True)
    (store / f"{framework}.json").write_text(json.dumps(results))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _verdict(stats: dict) -> dict:
    keep = ("tol_units", "max_abs", "n_bad", "size", "reason", "ok")
    return {k: stats[k] for k in keep if k in stats}


# --- the orchestrating process ------------------------------------------------------------------------------------


def cell_text(cell: dict | None) -> str:
    if cell is None:
        return "-"
    if "error" in cell:
        return cell["error"].split(":")[0]
    if "reason" in cell:
        return "DEPARTS (" + cell["reason"].split(" (")[0] + ")"
    units = cell["tol_units"]
    return "ok" if units <= 1.0 else f"DEPARTS x{units:.3g}"


def departures(results: dict) -> list[dict]:
    """Each converted path's cell that departs or fails where its framework's own float32 run is ok (or departs
    ``REAL_FACTOR`` times less): ``{layer, path, cell, native}``."""
    found = []
    for name, row in results.items():
        for framework, path_ids in PATHS.items():
            native = row.get(framework)
            if native is None or "tol_units" not in native or "reason" in native:
                continue  # no native float32 run to hold the path against
            base = native["tol_units"]
            for path_id in path_ids[1:]:
                cell = row.get(path_id)
                if cell is None or cell.get("ok"):
                    continue
                units = cell.get("tol_units", float("inf"))
                if "error" in cell or "reason" in cell or units > REAL_FACTOR * max(base, 1.0):
                    found.append({"layer": name, "path": path_id, "cell": cell, "native": native})
    return found


def table(results: dict, columns: list[str]) -> str:
    rows = [["layer", *columns]] + [[name, *(cell_text(row.get(p)) for p in columns)] for name, row in results.items()]
    widths = [max(len(r[k]) for r in rows) for k in range(len(columns) + 1)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _matches(name: str, patterns: list[str]) -> bool:
    """``name`` is one of ``patterns``, matches one as a glob, or lies under one (``rmsnorm`` -> ``norm/rmsnorm*``
    does not; ``norm`` -> ``norm/...`` does); no patterns: every name."""
    return not patterns or any(fnmatch.fnmatchcase(name, p) or name.startswith(p + "/") for p in patterns)


def _spawn(framework: str, phase: str, layers: list[str], path_ids: list[str], store: Path) -> str | None:
    """Run one worker; None where it ends well, else one line saying how it failed (with its last line of stderr:
    the log is in a temporary folder, gone once the probe ends)."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        f"{framework}:{phase}",
        "--layers",
        ",".join(layers),
        "--paths",
        ",".join(path_ids),
        "--store",
        str(store),
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    log_path = store / f"{framework}_{phase}.log"
    with open(log_path, "w") as log:
        try:
            done = subprocess.run(
                command,
                stdout=None if phase == "paths" else log,
                stderr=log,
                env=env,
                timeout=WORKER_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"{framework} {phase} worker ran past {WORKER_TIMEOUT_S:g} s and was stopped"
    if not done.returncode:
        return None
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    return f"{framework} {phase} worker ended with {done.returncode}" + (f": {lines[-1]}" if lines else "")


def probe(layer_patterns: list[str], path_patterns: list[str], store: Path) -> tuple[dict, list[str], list[str]]:
    """Every selected case through every selected path: ``({layer: {path: cell}}, the paths probed, the workers'
    failures)``, each failure said on stderr as it happens."""
    results: dict = {}
    columns: list[str] = []
    failures: list[str] = []
    for framework, path_ids in PATHS.items():
        chosen = [p for p in path_ids if _matches(p, path_patterns)]
        if not chosen:
            continue
        for phase in ("ref", "paths"):
            failed = _spawn(framework, phase, layer_patterns, chosen, store)
            if failed:
                print(f"error: {failed}", file=sys.stderr)
                failures.append(failed)
                break
        found = store / f"{framework}.json"
        rows = json.loads(found.read_text()) if found.exists() else {}
        if rows:
            columns += chosen
        for name, row in rows.items():
            results.setdefault(name, {}).update(row)
    return results, columns, failures


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="", help="comma-separated layer names or globs (rmsnorm/*, resize/*)")
    parser.add_argument("--paths", default="", help="comma-separated path ids or globs (torch/*, */onnx/ort)")
    parser.add_argument("--json", type=Path, help="write {layer: {path: cell}} and the departures here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        framework, phase = args.worker.split(":")
        worker(framework, phase, _csv(args.layers), _csv(args.paths), args.store)
        return 0
    known = [p for ps in PATHS.values() for p in ps]
    unknown = [p for p in _csv(args.paths) if not any(fnmatch.fnmatchcase(k, p) for k in known)]
    if unknown:
        print(f"error: no path matches {', '.join(unknown)} (paths: {', '.join(known)})", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="probe_layers_") as scratch:
        results, columns, failures = probe(_csv(args.layers), _csv(args.paths), Path(scratch))
        if not results and failures:
            print("error: every worker failed: nothing was probed", file=sys.stderr)
            return 1
        if not results:
            print(f"error: no layer matches --layers {args.layers}", file=sys.stderr)
            return 2
        found = departures(results)
        print()
        print(table(results, columns))
        print(f"\n{len(found)} departure(s) of converted paths where the framework's own float32 run holds:")
        for d in found:
            cell = d["cell"]
            detail = (
                cell.get("error")
                or cell.get("reason")
                or f"{cell['tol_units']:.3g}x the tolerance, max_abs {cell['max_abs']:.3g}, {cell['n_bad']} of {cell['size']} elements out"
            )
            print(f"  {d['layer']} on {d['path']}: {detail} (native: {cell_text(d['native'])})")
        print(f"\n{time.perf_counter() - started:.0f} s")
        if args.json:
            args.json.write_text(json.dumps({"results": results, "departures": found}, indent=1, default=float))
    if failures:
        print(f"error: {len(failures)} worker(s) failed: the table lacks their cases", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
