"""Shared fixtures: a private copy of the built-in workspace, and one export cache per session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """Bytecode for parity and its tests, written once by the session's first process, and pytest's own for the
    test modules whose asserts it rewrites (written by whichever process imports one first): where the environment
    says not to write bytecode (``PYTHONDONTWRITEBYTECODE``), every test process and every command a test runs in a
    process of its own would otherwise compile them again (4 s of each test process's collection)."""
    import compileall
    import sys

    sys.dont_write_bytecode = False
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        for folder in ("parity", "tests"):
            compileall.compile_dir(REPO / folder, quiet=2)


@pytest.fixture(scope="session", autouse=True)
def export_cache(tmp_path_factory):
    """All tests share one export cache, outside the repository and the user's own cache: with pytest-xdist,
    every test process shares it too (entries are locked and verified, so each export runs once)."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "parity-cache"
    cache.mkdir(exist_ok=True)
    yield from _environ("PARITY_CACHE_DIR", cache)


@pytest.fixture(scope="session", autouse=True)
def jax_compile_cache(tmp_path_factory):
    """One JAX compilation cache for the session: a test's own cache folder (``PARITY_CACHE_DIR``) then leaves the
    workers' environment as it was (``precision.jax_compile_cache``), and the templates kept serve its workers."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax-compile"
    cache.mkdir(exist_ok=True)
    yield from _environ("JAX_COMPILATION_CACHE_DIR", cache)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """A thread per worker (``PARITY_THREADS``): the test processes share the cores, and a command a test runs
    and the pools it holds start their workers with the same settings, from the same templates. Where there is no
    GPU, ``CUDA_VISIBLE_DEVICES`` is empty for every worker, as a check on the CPU makes it."""
    old = {name: os.environ.get(name) for name in ("PARITY_THREADS", "CUDA_VISIBLE_DEVICES")}
    os.environ["PARITY_THREADS"] = "1"
    if not Path("/dev/nvidia0").exists() and old["CUDA_VISIBLE_DEVICES"] is None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    yield
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def no_worker_service():
    """Every test's workers are its own process's (``tests/run/test_worker_service.py`` turns the service on)."""
    old = os.environ.get("PARITY_WORKER_SERVICE")
    os.environ["PARITY_WORKER_SERVICE"] = "off"
    yield
    if old is None:
        os.environ.pop("PARITY_WORKER_SERVICE", None)
    else:
        os.environ["PARITY_WORKER_SERVICE"] = old


@pytest.fixture(autouse=True)
def nothing_kept():
    """Each test starts with nothing kept in its own process from another test's descent (``parity.run.kept``)."""
    from parity.run import kept

    kept.forget()


@pytest.fixture(scope="session", autouse=True)
def results_store(tmp_path_factory):
    """Runs the tests make are stored in a store of the test session (``$PARITY_STORE``), never in a workspace's."""
    yield from _environ("PARITY_STORE", tmp_path_factory.getbasetemp() / "results.sqlite")


def worker_pool(timeout_s: float | None = 300, logs: Path | None = None):
    """A worker pool with a check's settings (``default_threads``, the CPU's worker environment): the pools of a
    test process and the commands its tests run then fork their workers from the same templates."""
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import default_threads
    from parity.platform.precision import worker_environment
    from parity.run.pool import WorkerPool

    env = worker_environment("cpu", "fp32")
    return WorkerPool(default_threads(), logs or cache_root() / "logs", timeout_s, env)


@pytest.fixture(scope="module")
def pool():
    """One worker process for a test module (a module that defines its own ``pool`` uses that)."""
    with worker_pool() as workers:
        yield workers


def init_model(root: Path, name: str, *source) -> None:
    """``parity init NAME SOURCE...`` (e.g. ``"--jax", "file.py:apply,params.npz", "--input", "x=2x6"``) and
    ``parity golden build`` of it in the workspace at ``root``; both must succeed."""
    from click.testing import CliRunner

    from parity.cli import cli

    for args in (["init", name, *source], ["golden", "build", "--model", name]):
        result = CliRunner().invoke(cli, [*map(str, args), "--workspace", str(root)], catch_exceptions=False)
        assert result.exit_code == 0, result.output


class Models:
    """A module's workspace whose models are initialised and golden-built (``init_model``) the first time a test
    asks for them: ``models("a", "b")`` is the workspace's root holding at least ``a`` and ``b``, ``models()`` holds
    all of them. The fast tests of a module then pay only for the models they use. A model's ``inits`` entry is its
    ``init`` arguments, or a function returning them that runs then too (one that writes the model's weights)."""

    def __init__(self, root: Path, inits: dict[str, list | Callable[[], list]]):
        self.root, self.inits, self.built = root, inits, set()

    def __call__(self, *names: str) -> Path:
        for name in names or self.inits:
            if name not in self.built:
                source = self.inits[name]
                init_model(self.root, name, *(source() if callable(source) else source))
                self.built.add(name)
        return self.root


def keras_init(root: Path, name: str, reference: str, shape: tuple) -> None:
    """``parity init`` of a Keras factory ``FILE:FUNCTION`` (as ``assert_parity`` calls it), one float32 input x."""
    from parity.pipeline import scaffold

    request = scaffold.Request(
        name=name,
        kind="tf",
        reference=reference,
        inputs=(scaffold.InputDecl("x", shape, "float32"),),
        builder="keras_factory",
    )
    scaffold.init(root, request, force=False, threads=1, timeout_s=300)


def keras_workspace(root: Path, pool, models: dict[str, tuple[str, tuple]], edit=None):
    """A workspace of Keras factories, ``{name: (FILE:FUNCTION, input shape)}``, each through ``keras_init`` and
    golden build; ``edit(root, name)`` runs between the two (a spec's tolerances tightened, say)."""
    from parity.golden import build as golden_build
    from parity.model.workspace import Workspace

    for name, (reference, shape) in models.items():
        keras_init(root, name, reference, shape)
        if edit is not None:
            edit(root, name)
    ws = Workspace(root)
    for name in models:
        golden_build.build(ws, ws.load_spec(name), pool)
    return ws


def _environ(name: str, value: Path):
    """A session fixture's body: ``$name`` set to ``value`` while the session runs, as it was afterwards."""
    old = os.environ.get(name)
    os.environ[name] = str(value)
    yield value
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


@pytest.fixture
def workspace_copy(tmp_path):
    """A workspace with the built-in mlp model and its golden data, safe to tamper with."""

    def make(model_source: str | None = None, name: str = "mlp") -> Path:
        root = tmp_path / "ws"
        (root / "models").mkdir(parents=True, exist_ok=True)
        (root / "golden").mkdir(exist_ok=True)
        source = model_source if model_source is not None else (REPO / "models" / "mlp.py").read_text()
        (root / "models" / f"{name}.py").write_text(source)
        if not (root / "golden" / name).exists():
            shutil.copytree(REPO / "golden" / "mlp", root / "golden" / name)
        return root

    return make


def zoo_copy(root: Path, *models: str) -> Path:
    """``root`` made a workspace holding copies of the built-in ``models`` and their golden data."""
    for model in models:
        (root / "models").mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "models" / f"{model}.py", root / "models")
        shutil.copytree(REPO / "golden" / model, root / "golden" / model)
    return root


def mlp_variant(replace: dict[str, str]) -> str:
    """The built-in mlp model source with text replacements (each must apply)."""
    source = (REPO / "models" / "mlp.py").read_text()
    for old, new in replace.items():
        assert old in source, old
        source = source.replace(old, new)
    return source


def reseal(golden_dir: Path, file: str | None = None, arrays: dict | None = None, edit=None) -> None:
    """Rewrite golden data *consistently*: new arrays in ``file``, manifest edited by ``edit(manifest)``,
    every sha256 and the digest recomputed. Proves a check that does not rely on checksums alone."""
    import json

    import numpy as np

    from parity.model.manifest import seal
    from parity.platform.safefs import sha256_file

    manifest_path = golden_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if file is not None:
        with open(golden_dir / file, "wb") as f:
            np.savez(f, **arrays)
        manifest["files"][file] = {
            "sha256": sha256_file(golden_dir / file),
            "arrays": {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in arrays.items()},
        }
    if edit is not None:
        edit(manifest)
    manifest_path.write_text(json.dumps(seal(manifest), indent=2))


def dead_owner_tag() -> str:
    """The owner tag of a process that has exited (what a killed run leaves in folder names)."""
    import subprocess
    import sys

    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    start = round(psutil.Process(child.pid).create_time() * 100)
    child.wait()
    return f"{child.pid}-{start}"


def sleep(seconds: float) -> None:
    """A worker task that hangs for ``seconds``."""
    import time

    time.sleep(seconds)


def failing_export(root: Path, name: str, source: list, path: str = "torch/onnx/ort", edit=None) -> tuple[dict, str]:
    """A user's torch model through the command line: ``init`` (``source``: its arguments after the name, e.g.
    ``["--torch", "file.py:make", "--input", "x=2x16"]``; ``edit`` rewrites the spec it writes), ``golden build``,
    and ``check`` of ``torch`` (which must pass) and ``path`` (which must fail): ``path``'s diagnosis and the output."""
    import json

    from click.testing import CliRunner

    from parity.cli import cli

    def invoke(*args):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    made = invoke("init", name, "--workspace", root, *source)
    assert made.exit_code == 0, made.output
    if edit:
        spec = root / "models" / f"{name}.py"
        spec.write_text(edit(spec.read_text()))
    built = invoke("golden", "build", "--workspace", root, "--model", name)
    assert built.exit_code == 0, built.output
    result = invoke("check", "--workspace", root, "--model", name, "--path", "torch", "--path", path, "--json", "-")
    verdicts = {r["path"]: r for r in json.loads(result.output[result.output.index("{") :])["results"]}
    assert verdicts["torch"]["verdict"] == "pass", verdicts["torch"]
    assert verdicts[path]["verdict"] == "fail", verdicts[path]
    return verdicts[path]["diagnosis"], result.output
