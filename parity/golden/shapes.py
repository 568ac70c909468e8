"""Golden data at the verification shapes: every path is checked at the golden shape and at each shape of
``ModelSpec.check_shapes()`` (batch 1, batch 3 with the named axes at another size), so an export that baked a
shape in is caught.

``shapes.npz`` holds, for shape ``k``, the inputs ``k/input/<name>`` and the reference outputs ``k/output/<name>``
(float64). Inputs are the eval inputs' first rows (repeated when there are fewer) with each named axis cut to its
size, or, for generated inputs, drawn afresh at that shape (seed + 1 + k). ``upgrade`` brings golden data of an
older schema to the current one: the older files stay byte for byte, the manifest is resealed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from parity.model import feeds, values
from parity.platform.errors import ParityError

FILE = "shapes.npz"


def shape_inputs(spec, evals: dict, data) -> dict[str, np.ndarray]:
    """``k/input/<name>`` for every verification shape ``k``: ``evals`` are the golden eval feeds, ``data`` the
    user model's ``InputData`` (None for the zoo)."""
    generated = data is not None and not (data.file or data.test_data or data.polygraphy_inputs)
    arrays = {}
    for k, shape in enumerate(spec.check_shapes()):
        batch = shape.get("batch", 1)
        if generated:
            x = feeds.generate(spec, batch, data.values(), np.random.default_rng(data.seed + 1 + k), shape)
        else:
            x = _cut(spec, evals, shape)
        arrays.update({f"{k}/input/{name}": value for name, value in x.items()})
    return arrays


def _cut(spec, evals: dict, shape: dict) -> dict[str, np.ndarray]:
    """The first ``batch`` eval rows (the last repeated where there are fewer), each named axis cut to its size."""
    batch = shape.get("batch", 1)
    x = feeds.padded(spec, feeds.rows(spec, evals, 0, batch), batch)
    out = {}
    for i in spec.model_inputs:
        value = x[i.name]
        offset = 1 if i.batched else 0
        for axis, dim in enumerate(i.shape):
            if isinstance(dim, str) and shape[dim] != spec.axes[dim]:
                if shape[dim] > spec.axes[dim]:
                    raise ParityError(
                        f"verification shape {shape}: axis {dim!r} of input {i.name!r} is longer than the "
                        f"data given ({spec.axes[dim]}); declare verify_shapes with sizes up to it"
                    )
                value = np.take(value, np.arange(shape[dim]), axis=axis + offset)
        out[i.name] = np.asarray(value, order="C")  # a scalar stays 0-d
    return out


def feeds_at(spec, arrays: dict, k: int) -> dict[str, np.ndarray]:
    """The feeds of verification shape ``k`` from ``shapes.npz``'s arrays."""
    return {i.name: arrays[f"{k}/input/{i.name}"] for i in spec.model_inputs}


def describe(shape: dict) -> str:
    """``batch=3, sequence=8``."""
    return ", ".join(f"{axis}={size}" for axis, size in shape.items())


def reference_outputs(spec, arrays: dict, run) -> dict[str, np.ndarray]:
    """``k/output/<name>`` for every shape: ``run(feeds, batch)`` gives the reference outputs by name; a model
    that rejects a shape raises ``ParityError`` naming it (a dynamic axis the model does not take)."""
    from parity.platform.errors import one_line

    outputs = {}
    for k, shape in enumerate(spec.check_shapes()):
        try:
            result = run(feeds_at(spec, arrays, k), shape.get("batch", 1))
        except ParityError:
            raise
        except Exception as error:  # noqa: BLE001 - the model's own failure at this shape
            raise ParityError(
                f"the model does not run at verification shape {describe(shape)} "
                f"({one_line(f'{type(error).__name__}: {error}', 300)}); declare the shapes it takes "
                f"with verify_shapes, or () for the golden shape alone"
            ) from None
        outputs.update({f"{k}/output/{name}": values.golden(result[name]) for name in spec.outputs})
    return outputs


def shape_references(
    workspace: str, model: str, framework: str, scratch: str | Path, dtype: str, params: dict | None
) -> None:
    """The reference outputs at every verification shape into ``shapes.npz`` (beside its inputs), in ``dtype``."""
    from parity import sources
    from parity.golden import weights as golden_weights
    from parity.golden.store import load_arrays, save_npz
    from parity.model.user import native_params
    from parity.model.workspace import Workspace

    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    scratch = Path(scratch)
    weights: Mapping | None
    if (scratch / golden_weights.FILE).exists():  # the zoo's canonical weights, or a copy golden data once kept
        weights = load_arrays(scratch, golden_weights.FILE)
        shapes = {k: list(v.shape) for k, v in weights.items()}
    else:  # a user model's own, as its golden manifest describes them
        weights = golden_weights.for_build(spec, golden_weights.ModelWeights(spec, scratch))
        shapes = {k: v["shape"] for k, v in (params or {}).items()}
    if params is not None:
        spec.params = native_params(shapes, params)
    arrays = load_arrays(scratch, FILE)
    if framework == "onnx":
        from parity.interop import onnx_file as onnx_source

        graph = onnx_source.load_checked(spec.onnx_model_path)

        def run(x, _batch):
            return onnx_source.reference_outputs(graph, x, dtype)
    else:

        def run(x, batch):
            return sources.native(framework)(spec, weights, batch, dtype).run(x)

    save_npz(scratch / FILE, {**arrays, **reference_outputs(spec, arrays, run)})


def upgrade(workspace, spec, pool, progress=lambda message: None) -> dict:
    """Golden data of an older schema (``manifest.UPGRADABLE``) to the current one: every file verified against
    the old manifest, ``shapes.npz`` computed by the reference framework, the manifest resealed; nothing else
    changes. Returns the new manifest."""
    from parity import __version__
    from parity.golden import store
    from parity.model import manifest as manifest_lib
    from parity.platform.errors import GoldenError
    from parity.platform.safefs import replace_dir, sha256_file, write_json_atomic

    golden_dir = workspace.golden_dir(spec.name)
    old = manifest_lib.read(golden_dir / store.MANIFEST, allow_older=True)
    if old["schema"] == manifest_lib.SCHEMA:
        return old
    if spec.weights_from_model:  # a user model's parameter table is its golden data's
        from parity.golden.store import load_arrays
        from parity.model.user import native_params

        weights = load_arrays(golden_dir, "weights.npz")
        spec.params = native_params({k: list(v.shape) for k, v in weights.items()}, old.get("params", {}))
    old_files = [name for name in store.FILES if name != FILE]
    for name in old_files:
        if sha256_file(golden_dir / name) != old["files"][name]["sha256"]:
            raise GoldenError(
                f"{golden_dir / name}: sha256 does not match its manifest; {manifest_lib.rebuild_hint(spec.name)}"
            )
    started = time.perf_counter()
    scratch = store.new_scratch(workspace, spec)
    try:
        for name in old_files:
            shutil.copyfile(golden_dir / name, scratch / name)
        progress(f"{spec.name}: reference at the verification shapes {[describe(s) for s in spec.check_shapes()]}")
        build_shapes(
            workspace,
            spec,
            scratch,
            pool,
            old["reference_framework"],
            (old.get("reference") or {}).get("dtype", "float64"),
            old.get("params"),
        )
        manifest = {key: value for key, value in old.items() if key != "digest"}
        manifest.update(
            schema=manifest_lib.SCHEMA,
            shapes=spec.check_shapes(),
            migrated={"from_schema": old["schema"], "parity": __version__},
        )
        manifest["files"] = {
            **old["files"],
            FILE: {"sha256": sha256_file(scratch / FILE), "arrays": store.describe_arrays(scratch / FILE)},
        }
        manifest["build_seconds"] = round(old["build_seconds"] + time.perf_counter() - started, 1)
        final = scratch / spec.name
        final.mkdir()
        for name in store.FILES:
            shutil.copyfile(scratch / name, final / name)
        write_json_atomic(final / store.MANIFEST, manifest_lib.seal(manifest))
        store.load(final, spec)  # what is about to be published reads back and verifies
        replace_dir(final, golden_dir)
        return manifest_lib.read(golden_dir / store.MANIFEST)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def build_shapes(workspace, spec, scratch: Path, pool, framework: str, dtype: str, params: dict | None) -> None:
    """``shapes.npz`` in ``scratch`` from its ``eval.npz``: inputs here, reference outputs in ``framework``'s
    worker in ``dtype`` (``params``: a user model's parameter table, as its manifest records it)."""
    from parity.golden.store import load_arrays, save_npz

    evals = feeds.from_arrays(spec, load_arrays(scratch, "eval.npz"))
    save_npz(scratch / FILE, shape_inputs(spec, evals, spec.inputs if spec.weights_from_model else None))
    pool.call(
        framework,
        "parity.golden.shapes:shape_references",
        workspace=str(workspace.root),
        model=spec.name,
        framework=framework,
        scratch=str(scratch),
        dtype=dtype,
        params=params,
    )
