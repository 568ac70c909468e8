"""pytest support: ``assert_parity`` checks a model's export paths from any test suite, with no workspace.

    from parity.testing import assert_parity

    def make_model():                     # module level: parity imports it in a worker process
        return MyNet().eval()

    def test_onnx_export_matches():
        x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype("float32")
        assert_parity(make_model, x, paths=["torch/onnx/ort"], atol=1e-4, rtol=1e-4)

It runs what ``parity init``, ``parity golden build`` and ``parity check`` run, in a private temporary
workspace that is removed afterwards, and raises ``AssertionError`` whose message is the verdict table
of the failing paths with their diagnosis (the first divergent tap where the model has taps).
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from pathlib import Path

import numpy as np

SOURCES = {"torch": "torch_factory", "tf": "keras_factory"}


def assert_parity(
    make_model,
    inputs,
    paths=("torch/onnx/ort",),
    atol: float = 1e-4,
    rtol: float = 1e-4,
    labels=None,
    threads: int = 1,
    timeout_s: float | None = None,
) -> dict:
    """Check ``paths`` of the model ``make_model()`` returns against its own float64 reference on ``inputs``.

    ``make_model``: a module-level function returning a ``torch.nn.Module`` (paths ``torch*``) or a
    ``keras.Model`` (paths ``tf*``), or the path of an ONNX file (paths ``onnx/*``). ``inputs``: one
    batch, batch first: an array, or ``{name: array}`` for a model with several inputs (a torch module gets them
    as keywords, a Keras model as a dict). ``labels`` (integers, one per
    sample) also checks gradients of the cross-entropy and the task metrics. ``timeout_s``: each build, export
    and check's wall-clock limit (default: scaled with the model's weights; one that makes no progress ends
    sooner, see ``PARITY_STALL_TIMEOUT``). Returns the result (the
    ``parity.result/2`` dict) when every path passes.
    """
    from parity.golden import build as golden_build
    from parity.golden import store as golden
    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate, outcome, scaffold
    from parity.platform.cache_dir import cache_root
    from parity.platform.precision import worker_environment
    from parity.report import diagnosis, terminal
    from parity.run.pool import WorkerPool

    paths = [paths] if isinstance(paths, str) else list(paths)
    sources = {p.split("/")[0] for p in paths}
    if len(sources) != 1 or not paths:
        raise ValueError(f"paths must share one source framework, got {paths}")
    kind = sources.pop()
    feeds = _feeds(inputs)
    root = Path(tempfile.mkdtemp(prefix="parity-assert-"))
    try:
        data = dict(feeds) if labels is None else {**feeds, "labels": np.asarray(labels, dtype=np.int64)}
        golden.save_npz(root / "inputs.npz", data)
        decls = tuple(
            scaffold.InputDecl(name, tuple(x.shape), str(x.dtype) if x.dtype.kind in "iub" else "float32")
            for name, x in feeds.items()
        )
        request = scaffold.Request(
            name="model_under_test",
            kind=kind,
            reference=_reference(make_model, kind),
            inputs=decls,
            inputs_file="inputs.npz",
            tolerance=(atol, rtol),
            floor=0.0,  # the tolerance given here is the tolerance
            builder=SOURCES.get(kind),
        )
        scaffold.init(root, request, force=False, threads=threads, timeout_s=timeout_s)
        workspace = Workspace(root)
        options = orchestrate.Options(threads=threads, patterns=tuple(paths), timeout_s=timeout_s)
        env = worker_environment(options.device, options.precision)
        with WorkerPool(threads, cache_root() / "logs", timeout_s, env, service=True) as pool:
            golden_build.build(workspace, workspace.load_spec(request.name), pool)
            report = orchestrate.check(workspace, [request.name], options, pool=pool)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    failing = [r for r in report["results"] if outcome.is_unexpected(r) or r["verdict"] == "skip"]
    if failing or report["model_errors"]:
        shown = {**report, "results": failing}
        text = terminal.render(shown, timed=False, verbose=True)
        block = diagnosis.render_all(shown)
        raise AssertionError(
            "parity: paths differ from the float64 reference\n" + text + (f"\n\n{block}" if block else "")
        )
    return report


def _feeds(inputs) -> dict[str, np.ndarray]:
    feeds = {
        name: np.asarray(value) for name, value in (inputs.items() if isinstance(inputs, dict) else [("x", inputs)])
    }
    if not feeds or any(name in ("labels", "y") for name in feeds):
        raise ValueError(f"inputs must name at least one input, none called labels or y (got {', '.join(feeds)})")
    for name, value in feeds.items():
        if value.ndim < 1 or value.dtype.kind not in "fiub":
            raise ValueError(
                f"input {name!r} must be a numeric array with a batch axis, not {value.dtype}{list(value.shape)}"
            )
    return feeds


def _reference(make_model, kind: str) -> str:
    """``file.py:qualname`` for a module-level function (or the ONNX file's absolute path)."""
    if kind == "onnx":
        return str(Path(make_model).resolve())
    qualname = getattr(make_model, "__qualname__", "")
    if not callable(make_model) or "<" in qualname:
        raise ValueError(
            f"make_model must be a module-level function (parity imports it in a worker process), not {make_model!r}"
        )
    return f"{Path(inspect.getfile(make_model)).resolve()}:{qualname}"
