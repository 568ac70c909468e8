"""The jobs of the commands around a run, each one call from the CLI: build and verify golden data, the path
matrix as rows (``parity paths``), a model's golden data as ONNX test data, ``parity init`` (a user's model, a
language model) and ``parity repro`` (a failing path reduced to a bug report). No framework is imported here;
every framework runs in a worker process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from parity.pipeline.jobs import _quiet, open_workspace
from parity.platform.errors import ParityError, UsageError


@dataclass(frozen=True)
class GoldenOutcome:
    """One model's golden build or verification: the manifest, or the error that stopped it."""

    name: str
    golden_dir: Path
    manifest: dict | None = None
    error: str | None = None
    peaks: dict[str, int] | None = None  # worker task -> its peak memory (bytes)

    @property
    def summary(self) -> str:
        from parity.golden import store

        if self.manifest is None:  # the build or verification stopped: its error is the summary
            return self.error or "no golden data"
        if self.manifest.get("task"):  # a generation golden (``parity.generation.golden``)
            reference = self.manifest["reference"]
            return (
                f"float64 greedy generation, {reference['steps']} steps on {reference['prompts']} prompts, "
                f"vocabulary {reference['vocab']}, built in {self.manifest['build_seconds']} s"
            )
        return store.summary(self.manifest, self.golden_dir) + self.peak_memory

    @property
    def peak_memory(self) -> str:
        """`` | peak memory: reference 3.0 GB, ...``: each step's worker at its peak, the largest first."""
        if not self.peaks:
            return ""
        from parity.platform.memory import gb

        steps = sorted(self.peaks.items(), key=lambda item: -item[1])
        return " | peak memory: " + ", ".join(f"{task.rpartition(':')[2]} {gb(n)}" for task, n in steps[:4])


def build_goldens(
    workspace: str | None, models, threads: int | None, progress=_quiet, notice=_quiet, upgrade: bool = False
) -> Iterator[GoldenOutcome]:
    """Build each selected model's golden data in turn (one model's failure does not stop the next); ``upgrade``:
    bring golden data of an older schema to the current one instead (``parity.golden.shapes.upgrade``)."""
    from parity.generation import golden as generation_golden
    from parity.golden import build as golden_build
    from parity.golden import shapes
    from parity.model import weight_files
    from parity.pipeline import generation
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import default_threads
    from parity.platform.errors import TaskFailed
    from parity.run.pool import WorkerPool

    ws = open_workspace(workspace, notice)
    if ws.is_fallback:
        raise UsageError(
            f"golden {'upgrade' if upgrade else 'build'} writes only into a workspace you name: run it "
            f"in a folder with models/, or pass --workspace {ws.root} for the built-in zoo"
        )
    with WorkerPool(threads or default_threads(), cache_root() / "logs", timeout_s=1800) as pool:
        for name in ws.select(models):
            try:
                # the spec as declared: the golden data it replaces may be what is refused
                spec = ws.load_spec(name, attach_golden=False)
                if generation.is_generation(spec):  # a language model's golden: its greedy generation, step by step
                    if upgrade:
                        raise UsageError(f"{name}: generation golden data has one schema; nothing to upgrade")
                    manifest = generation_golden.build(ws, spec, pool, progress=progress)
                    yield GoldenOutcome(name, ws.golden_dir(name), manifest=manifest)
                    continue
                step = shapes.upgrade if upgrade else golden_build.build
                pool.peaks.clear()
                sized = pool.for_model(_weights_bytes(pool, ws, spec), mapped=weight_files.mapped(spec))
                with sized:  # each step's memory said before it starts
                    manifest = step(ws, spec, pool, progress=progress)
            except (ParityError, TaskFailed) as error:
                yield GoldenOutcome(name, ws.golden_dir(name), error=str(error))
                continue
            yield GoldenOutcome(name, ws.golden_dir(name), manifest=manifest, peaks=dict(pool.peaks))


def _weights_bytes(pool, ws, spec) -> int | None:
    """The size of a user model's weights before its golden build (``parity.model.size``), None where it is not
    known without building the model (the zoo's are small)."""
    if not spec.weights_from_model:
        return None
    return pool.call(
        spec.frameworks[0],
        "parity.model.size:weights_bytes",
        workspace=str(ws.root),
        model=spec.name,
    )


def verify_goldens(workspace: str | None, models, notice=_quiet) -> Iterator[GoldenOutcome]:
    """Verify each selected model's golden files against its manifest (every model, failures included)."""
    from parity.generation import golden as generation_golden
    from parity.golden import store
    from parity.pipeline import generation

    ws = open_workspace(workspace, notice)
    for name in ws.select(models):
        try:
            spec = ws.load_spec(name)
            if generation.is_generation(spec):
                manifest = generation_golden.verify(ws.golden_dir(name), spec, ws.root)
            else:
                manifest = store.verify(ws.golden_dir(name), spec)
        except ParityError as error:
            yield GoldenOutcome(name, ws.golden_dir(name), error=str(error))
            continue
        yield GoldenOutcome(name, ws.golden_dir(name), manifest=manifest)


def path_rows(workspace: str | None, models, devices, precisions, notice=_quiet) -> list[dict]:
    """The path matrix as rows (id, device, precision, export steps, why unavailable, runtime note), limited to
    the frameworks of ``models`` when any are named."""
    from parity.pipeline import generation
    from parity.platform.precision import parse_device
    from parity.run import paths as path_registry

    frameworks = None
    generating: dict[str, None] = {}  # the generation paths of the named text-generation models
    if models:
        ws = open_workspace(workspace, notice)
        frameworks = set()
        for name in ws.select(models):
            spec = ws.load_spec(name)
            if generation.is_generation(spec):
                generating.update(dict.fromkeys(generation.selected(spec, ())))
            else:
                frameworks.update(spec.frameworks)
    devices = tuple(dict.fromkeys(parse_device(d) for d in devices)) or ("cpu", "cuda:0")
    rows = [
        {
            "id": path_id,
            "device": "cpu",
            "precision": "fp32",
            "steps": " -> ".join(generation.PATHS[path_id].stages),
            "reason": None,
            "note": "text-generation: prefill and greedy decode steps with a key/value cache",
        }
        for path_id in generating
    ]
    for path in path_registry.matrix(devices, precisions or path_registry.ALL):
        if frameworks is None or path.source in frameworks:
            rows.append(
                {
                    "id": path.id,
                    "device": path.device,
                    "precision": path.precision,
                    "steps": " -> ".join(s.name for s in path.exports)
                    or ("native" if path.id in path_registry.NATIVE else path.runtime.name),
                    "reason": path_registry.unavailable_reason(path),
                    "note": "; ".join(
                        n
                        for n in (
                            path.runtime.note,
                            *(s.note for s in path.exports),
                            path.opt_in and f"opt-in ({path.opt_in}): name it with --path",
                        )
                        if n
                    ),
                }
            )
    return rows


def _forward_pass(ws, name: str, command: str):
    """``name``'s spec, refused with one line where it is a generation model (checked step by step, not as one
    forward pass: ``parity check`` verifies it)."""
    from parity.pipeline import generation

    spec = ws.load_spec(name)
    if generation.is_generation(spec):
        raise UsageError(f"{command} works on one forward pass; {name} is a text-generation model: parity check it")
    return spec


def export_test_data(workspace: str | None, model: str, out_dir: str, notice=_quiet) -> tuple[Path, object]:
    """A model's golden inputs and outputs as ONNX test data under ``out_dir``; the folder written and the spec."""
    import numpy as np

    from parity.golden import store
    from parity.interop import onnx_test_data as interop
    from parity.model import feeds

    ws = open_workspace(workspace, notice)
    (name,) = ws.select([model])
    spec = _forward_pass(ws, name, "export-testdata")
    verified = store.load(ws.golden_dir(name), spec)
    reference = verified.arrays["reference.npz"]
    written = interop.write_test_data(
        Path(out_dir),
        feeds.from_arrays(spec, verified.arrays["inputs.npz"]),
        {
            out: reference[out].astype(np.float32) if reference[out].dtype.kind == "f" else reference[out]
            for out in spec.outputs
        },
    )
    return written, spec


def init_model(
    name: str,
    sources: dict[str, str | None],
    input_decls: tuple[str, ...],
    axes: tuple[str, ...],
    files: dict[str, str | None],
    seed: int,
    force: bool,
    workspace: str | None,
    opset: int | None = None,
    weights: str | None = None,
) -> tuple[Path, dict, str]:
    """``parity init``: ``sources`` maps torch/tf/jax/onnx/hf to what was given (exactly one; ``hf``: a transformers
    folder, a torch model), ``files`` the data files (inputs_file, test_data, polygraphy_inputs, polygraphy_outputs),
    ``weights`` a torch model's safetensors file or folder. Returns the spec written, what the model said about
    itself, and the source kind."""
    from parity.pipeline import scaffold
    from parity.platform.env import default_threads

    chosen = [(kind, ref) for kind, ref in sources.items() if ref]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --torch, --keras, --jax, --onnx, --hf")
    kind, reference = chosen[0]
    root = Path(workspace or ".").resolve()
    params_file, builder = None, None
    if kind == "hf":
        if weights:
            raise UsageError("--hf maps the folder's own safetensors; --weights is for --torch")
        kind, builder = "torch", "hf_model"
        if not input_decls and not any(files.values()):
            input_decls = (f"input_ids=2x64:int64:{_vocabulary(Path(reference))}",)
    if kind == "jax":
        reference, _, params_file = reference.partition(",")
        if not params_file:
            raise UsageError("--jax takes MODULE:FUNCTION,PARAMS.npz (the apply function and its weights)")
        params_file = scaffold.workspace_reference(params_file, root)
    if weights:
        if kind != "torch":
            raise UsageError("--weights takes --torch MODULE:FUNCTION (the architecture its safetensors fill)")
        params_file = scaffold.workspace_reference(weights, root)
    request = scaffold.Request(
        name=name,
        kind=kind,
        reference=scaffold.workspace_reference(reference, root),
        params_file=params_file,
        inputs=tuple(scaffold.parse_input(text) for text in input_decls),
        axes=tuple(scaffold.parse_axis(text) for text in axes),
        seed=seed,
        opset=opset,
        builder=builder,
        # the file options only: mypy reads every field's type into the ** expansion
        **{key: value and scaffold.workspace_reference(value, root) for key, value in files.items()},  # type: ignore[arg-type]
    )
    written, info = scaffold.init(root, request, force, default_threads())
    return written, info, kind


def _vocabulary(folder: Path) -> int:
    """The vocabulary size a transformers folder's ``config.json`` gives (its own, or its text model's): the ids of
    the default input, 2 x 64 tokens."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{folder}: no readable config.json ({error})") from None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size < 2:
        raise UsageError(f"{folder}/config.json gives no vocab_size: declare the model's inputs with --input")
    return size


def init_generation(
    name: str, hf: str | None, torch_ref: str | None, force: bool, workspace: str | None, prompts: str | None = None
) -> Path:
    """``parity init --task text-generation``: the spec of a causal LM from a folder or a factory (``prompts``: a
    ``.npz`` of input_ids and attention_mask instead of seeded random prompts)."""
    from parity.pipeline import generation, scaffold

    root = Path(workspace or ".").resolve()
    reference = torch_ref and scaffold.workspace_reference(torch_ref, root)
    return generation.init(root, name, hf, reference, force, prompts and scaffold.workspace_reference(prompts, root))


def repro(
    workspace: str | None,
    model: str,
    path_id: str,
    out_dir: str,
    force: bool,
    precision: str,
    threads: int,
    timeout_s: float | None,
    command: str,
    progress=_quiet,
    notice=_quiet,
    device: str = "cpu",
) -> tuple[int, str]:
    """``parity repro``: check and diagnose one path, reduce its exported graph, write the bug report folder.

    Returns ``(exit code, one line)``: 0 with the folder written, or when the path passes (nothing to reduce); 1 when
    the failure stops reproducing during the reduction; 2 when there is no exported graph to reduce (an error, a
    skip, a native path or tf/litert with no leaf layer that fails alone (``repro_native``), a drift that enters at
    the definition). A non-empty ``out_dir`` needs ``force``; the reduction runs on the CPU runtimes only (``device`` other than cpu is a usage error)."""
    from parity.diagnose.repro import trusted_for
    from parity.golden import store as golden
    from parity.model import weight_files
    from parity.pipeline import orchestrate
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import environment
    from parity.platform.errors import TaskFailed
    from parity.platform.precision import parse_device
    from parity.platform.safefs import check_folder_target
    from parity.run import paths, watch
    from parity.run.pool import WorkerPool

    out = check_folder_target(out_dir, "--out")  # links followed; a file in the way refused before any work
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out_dir} is not an empty folder: choose another or pass --force to replace it")
    if parse_device(device) != "cpu":
        raise UsageError(
            f"--device {device}: parity repro reduces graphs on the CPU runtimes (ort, ort-noopt, onnxref) only"
        )
    ws = open_workspace(workspace, notice)
    names = ws.select([model])
    from parity.pipeline import generation

    if generation.is_generation(ws.load_spec(names[0])):  # its first divergent step, cut at the diagnosis's leaf
        from parity.pipeline import generation_repro

        return generation_repro.repro(ws, names[0], path_id, out, precision, threads, timeout_s, command, progress)
    path = paths.by_id(path_id, "cpu", precision)
    options = orchestrate.Options(threads=threads, patterns=(path_id,), precision=precision, timeout_s=timeout_s)
    report = orchestrate.check(ws, names, options, progress=progress)
    result = next((r for r in report["results"] if r["path"] == path.id), None)
    if result is None:
        errors = "; ".join(str(e) for e in report.get("model_errors") or []) or "not checked"
        return 2, f"nothing to reduce: {model} {path.id} was not checked ({errors})"
    where = f"{model} {path.id}"
    if result["verdict"] == "pass":
        return 0, f"nothing to reduce: {where} passes"
    if result["verdict"] != "fail":
        return 2, f"nothing to reduce: {where} is {result['verdict']} ({result.get('reason') or 'no reason'})"
    diagnosis = result.get("diagnosis") or {}
    from parity.pipeline import repro_native

    if not path.exports or path.runtime.name not in ("ort", "ort-noopt", "onnxref"):  # no ONNX graph: one layer
        if path.id not in repro_native.PATHS or diagnosis.get("split"):
            return 2, repro_native.refusal(where, path, diagnosis)
        spec = ws.load_spec(model)
        manifest = golden.verify(ws.golden_dir(model), spec)
        return repro_native.repro(ws, spec, manifest, path, options, diagnosis, out, out_dir, command, progress)
    if diagnosis.get("error"):
        return 2, f"nothing to reduce: {diagnosis['error']}"
    if diagnosis.get("split"):
        return 2, repro_native.refusal(where, path, diagnosis)
    if trusted_for(diagnosis, path.runtime.name) is None:
        link = (diagnosis.get("links") or {}).get("enters_at")
        return 2, (
            f"nothing to reduce: {where}'s drift enters at the {link}, not in the exported graph"
            if link
            else f"nothing to reduce: the diagnosis of {where} names no link that a graph could reproduce"
        )
    spec = ws.load_spec(model)
    manifest = golden.verify(ws.golden_dir(model), spec)
    sized = {"weights_bytes": watch.weights_bytes(manifest), "mapped": weight_files.mapped(spec)}
    with WorkerPool(threads, cache_root() / "logs", timeout_s) as pool, pool.for_model(**sized):
        run = orchestrate.Run(ws, options)
        run._identify(pool, [(spec, manifest, path, None)])  # the export is keyed on the weights, as check keys it
        artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1)
        leaf = {}
        if trusted_for(diagnosis, path.runtime.name) == "source":  # cut at the leaf the descent found
            from parity.diagnose.descend import leaf_known

            leaf = leaf_known(pool, spec, path, str(ws.root), str(ws.golden_dir(model)), threads, diagnosis)
        progress(f"{model}: reduce {path.id}")
        try:
            outcome = pool.call(
                path.runtime.group,
                "parity.diagnose.repro:write",
                workspace=str(ws.root),
                model=model,
                path_id=path.id,
                golden_dir=str(ws.golden_dir(model)),
                precision=precision,
                threads=threads,
                artifact_dir=artifact["dir"],
                artifact_meta=artifact["meta"],
                diagnosis=diagnosis,
                out_dir=str(out),
                environment=environment(threads),
                command=command,
                leaf_known=leaf,
            )
        except TaskFailed as error:
            return 1, f"the reduction of {where} failed: {error}"
    counts = (
        f"{outcome['nodes_before']} nodes -> {outcome['nodes_after']}, {outcome['checks']} checks, "
        f"{outcome['seconds']:.2f} s"
    )
    if not outcome["written"]:
        return 1, f"no bug report: the failure of {where} does not reproduce in its reduced graph: {outcome['reason']}"
    return 0, (
        f"wrote {out_dir}: {where} reduced to {' -> '.join(outcome['ops'])} ({counts}); "
        f"`python {Path(out_dir) / 'repro.py'}` exits 1 while the bug is present"
    )
