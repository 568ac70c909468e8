"""The house rules: subpackages by stage of the pipeline, no upward import, no import circle.

Reads every module's imports (module level and inside functions) and every task named as a string
(``"parity.run.tasks:check_path"``: a worker imports it), so a rule broken anywhere is found here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import parity

ROOT = Path(parity.__file__).resolve().parent

# Bottom to top: a module may import its own stage and the stages before it, never one after it.
STAGES = [
    "platform",
    "interop",
    "model",
    "check",
    "runtimes",
    "sources",
    "exporters",
    "golden",
    "run",
    "bench",
    "diagnose",
    "generation",
    "report",
    "results",
    "pipeline",
    "testing",
    "cli",
    "__main__",
]

# ``parity.diagnose`` by concern: each room may import the rooms named here, never another (the core, the modules
# directly in ``parity/diagnose/``, may import them all); rooms of other stages are the stages themselves
ROOMS = {
    "causes": set(),
    "graph": {"causes"},
    "tree": {"causes", "graph"},
    "precision": {"causes", "graph", "tree"},
    "core": {"causes", "graph", "tree", "precision"},
}
ROOM_SHARE = 0.15  # of the package's lines, at most, in one room
FILE_LINES = 550


def module_name(path: Path) -> str:
    parts = ("parity", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "platform"  # the package's own __init__ sits at the bottom


def imports(module: str) -> dict[str, int]:
    """Every parity module ``module`` imports, with the line of the first import."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        while name not in MODULES and "." in name:  # an attribute of a module, not a module
            name = name.rpartition(".")[0]
        if name in MODULES and name != module:
            found.setdefault(name, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base == "parity" or base.startswith("parity."):
                for alias in node.names:
                    add(f"{base}.{alias.name}", node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("parity"):
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("parity."):
            target, colon, _ = node.value.partition(":")
            if colon:  # a worker task named as "module:function"
                add(target, node.lineno)
    return found


def test_every_task_named_by_string_exists():
    missing = [
        f"{module} names task module {name}" for module in MODULES for name in imports(module) if name not in MODULES
    ]
    assert not missing


def test_no_stage_imports_a_later_stage():
    assert set(map(stage, MODULES)) <= set(STAGES), set(map(stage, MODULES)) - set(STAGES)
    upward = []
    for module in sorted(MODULES):
        for name, line in imports(module).items():
            if STAGES.index(stage(name)) > STAGES.index(stage(module)):
                upward.append(
                    f"{module} (line {line}, stage {stage(module)}) imports {name} (a later stage, {stage(name)})"
                )
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    graph = {module: set(imports(module)) for module in MODULES}
    circles, state = [], {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for name in sorted(graph[module]):
            if state.get(name) == "open":
                circles.append(" -> ".join(trail[trail.index(name) :] + [module, name]))
            elif name not in state:
                visit(name, trail + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_every_subpackage_says_what_lives_there():
    silent = [
        name
        for name, path in MODULES.items()
        if path.name == "__init__.py"
        and name != "parity"
        and not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    ]
    assert not silent, f"subpackages without a docstring: {silent}"


def test_model_files_written_before_the_move_still_load(workspace_copy):
    from parity.model.spec import ModelSpec
    from parity.model.workspace import Workspace
    from tests.conftest import mlp_variant

    old = mlp_variant({"from parity.model.spec import": "from parity.spec import"})
    spec = Workspace(workspace_copy(old)).load_spec("mlp")
    assert isinstance(spec, ModelSpec)
    import parity.usermodel

    import parity.model.user

    assert parity.usermodel is parity.model.user


def room(module: str) -> str:
    """A diagnose module's room (``core`` for the modules directly in ``parity/diagnose/``); another stage's name."""
    parts = module.split(".")
    if stage(module) != "diagnose":
        return stage(module)
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and parts[2] in ROOMS) else "core"


def test_diagnose_rooms_import_only_the_rooms_below_them():
    assert {room(m) for m in MODULES if stage(m) == "diagnose"} == set(ROOMS)
    crossing = [
        f"{module} (line {line}, room {room(module)}) imports {name} (room {room(name)}, "
        f"not one {room(module)} may import: {sorted(ROOMS[room(module)]) or 'none'})"
        for module in sorted(MODULES)
        if stage(module) == "diagnose"
        for name, line in imports(module).items()
        if stage(name) == "diagnose" and room(name) != room(module) and room(name) not in ROOMS[room(module)]
    ]
    assert not crossing, "\n".join(crossing)


def test_no_room_holds_too_much_and_no_file_is_too_long():
    lines = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    total = sum(lines.values())
    rooms: dict[str, int] = {}
    for module, count in lines.items():
        key = f"diagnose/{room(module)}" if stage(module) == "diagnose" else stage(module)
        rooms[key] = rooms.get(key, 0) + count
    big = [f"{key}: {n} lines, {n / total:.0%} of {total}" for key, n in rooms.items() if n > ROOM_SHARE * total]
    assert not big, f"rooms over {ROOM_SHARE:.0%} of the package: {big}"
    long = [f"{MODULES[m].relative_to(ROOT)}: {n} lines" for m, n in lines.items() if n > FILE_LINES]
    assert not long, f"files over {FILE_LINES} lines: {long}"


def test_import_linter_holds_the_package_to_its_contracts():
    """The same rules read by import-linter (pyproject.toml's ``[tool.importlinter]``), a second reader of every
    import: the stages in order, diagnose's rooms in order, no circle between the subpackages of one package. In a
    process of its own: import-linter configures the logging of the process it runs in."""
    import subprocess
    import sys

    config = str(ROOT.parent / "pyproject.toml")
    code = f"import sys; from importlinter import cli; sys.exit(cli.lint_imports(config_filename={config!r}, no_cache=True))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout


def test_the_tests_mirror_the_package():
    """A test file lives in the folder of the stage (or ``diagnose`` room) it tests, ``tests/diagnose/tree/`` for
    ``parity/diagnose/tree/``; only the whole tool's own tests sit at the top, beside the models tests share."""
    tests = Path(__file__).resolve().parent
    folders = {path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*") if path.is_dir()}
    stray = [
        path.relative_to(tests).as_posix()
        for path in tests.rglob("test_*.py")
        if path.parent != tests and path.parent.relative_to(tests).as_posix() not in folders
    ]
    assert not stray, f"test files in folders that are not parity's: {stray}"
    top = sorted(path.name for path in tests.glob("test_*.py"))
    assert top == ["test_docs.py", "test_house.py", "test_typed_fixes.py", "test_zoo.py"], top
