"""The documentation cannot drift from the code.

Every shell block of README.md and docs/ (```console with ``$ `` prompts, ```bash, and the README's indented
set-up block) is read: each ``parity ...`` command must parse with click's own parser against the real CLI (the
command exists, every option exists and takes the value given, a choice is one of its choices), and the cheap
ones run on a copy of the zoo. Every ```python block compiles; one after ``<!-- runnable -->`` runs. The site
builds with ``mkdocs build --strict`` (a broken link, anchor, page or API reference fails it).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from parity.cli import cli
from tests.conftest import REPO, zoo_copy

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
RUNNABLE = "<!-- runnable -->"
SUBSTITUTION = re.compile(r"\$\((parity\b[^)]*)\)")
OPERATORS = {"&&", "||", "|", ";", "&", "(", ")"}
REDIRECTION = re.compile(r"\s[0-9]?(?:>>?|<)&?[0-9]?\s*[^\s;&|]*")  # 2>/dev/null, > out.txt, 2>&1
MISSING = getattr(click.core, "UNSET", None)  # what click's parser leaves for an argument not given
PATH_TYPES = (click.Path, click.File)  # existence is the reader's machine's business, not the docs'


@dataclass(frozen=True)
class Block:
    """One code block of a page: its language, text, where it starts, and whether it is marked runnable."""

    file: Path
    line: int
    lang: str
    text: str
    runnable: bool = False

    def where(self) -> str:
        return f"{self.file.relative_to(REPO)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (indented fences in lists too); for README.md also its indented
    blocks, which hold the set-up commands."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening:
            indent, fence = len(opening["indent"]), opening["fence"]
            before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
                j += 1
            blocks.append(Block(path, i + 1, opening["info"].lower(), "\n".join(body), before == RUNNABLE))
            i = j + 1
            continue
        if path.name == "README.md" and lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            body, j = [], i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                body.append(lines[j][4:])
                j += 1
            blocks.append(Block(path, i + 1, "bash", "\n".join(body).strip()))
            i = j
            continue
        i += 1
    return blocks


def shell_commands(block: Block) -> list[str]:
    """The commands of a shell block: ``$ `` lines of a console block (the rest is output), every line of a bash
    block; a line ending in a backslash continues on the next."""
    if block.lang not in ("console", "bash", "sh", "shell"):
        return []
    commands, pending = [], None
    for line in block.text.splitlines():
        if pending is not None:
            line = pending + " " + line.strip()
        elif block.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        pending = line[:-1] if line.endswith("\\") else None
        if pending is None and line.strip():
            commands.append(line.strip())
    return commands


def parity_invocations(command: str) -> list[list[str]]:
    """The argument lists of every ``parity`` call in a shell command line: after ``&&``, ``|`` or ``;``, and inside
    ``$(...)``; comments and redirections dropped."""
    calls = [args for inner in SUBSTITUTION.findall(command) for args in parity_invocations(inner)]
    lexer = shlex.shlex(REDIRECTION.sub(" ", command), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    segment: list[str] = []
    for token in [*lexer, ";"]:
        if token in OPERATORS:
            if segment[:1] == ["parity"]:
                calls.append(segment[1:])
            segment = []
        else:
            segment.append(token)
    return calls


def check_invocation(args: list[str]) -> click.Command:
    """Parse ``parity *args`` with click's own parser against the real CLI; raise ``click.UsageError`` (or
    ``click.BadParameter``) naming what does not exist. Returns the command."""
    command, names, rest = cli, ["parity"], list(args)
    while isinstance(command, click.Group):
        if not rest or rest[0].startswith("-"):
            break
        if rest[0] not in command.commands:
            raise click.UsageError(f"no command {' '.join([*names, rest[0]])!r}")
        command = command.commands[rest[0]]
        names.append(rest.pop(0))
    ctx = click.Context(command, info_name=" ".join(names))
    values, extra, _ = command.make_parser(ctx).parse_args(rest)
    if isinstance(command, click.Group):
        if not any(name in values for name in ("_click_default_help", "version")) and (extra or not rest):
            raise click.UsageError(f"{' '.join(names)} needs a command")
        return command
    if extra:
        raise click.UsageError(f"{' '.join(names)}: unexpected arguments {extra}")
    asks_help = "_click_default_help" in values
    for param in command.get_params(ctx):
        if param.name in values and not isinstance(param.type, PATH_TYPES):
            param.type_cast_value(ctx, values[param.name])
        if (
            isinstance(param, click.Argument)
            and param.required
            and values.get(param.name, MISSING) is MISSING
            and not asks_help
        ):
            raise click.UsageError(f"{' '.join(names)}: missing argument {param.name.upper()}")
    return command


def every_invocation() -> list[tuple[str, list[str] | None]]:
    """(where and what, the arguments) of every ``parity`` call the docs show; None for a line no shell could read."""
    found = []
    for path in DOCS:
        for block in code_blocks(path):
            for command in shell_commands(block):
                try:
                    found += [
                        (f"{block.where()}: parity {' '.join(args)}", args) for args in parity_invocations(command)
                    ]
                except ValueError as exc:  # shlex: an unclosed quote
                    found.append((f"{block.where()}: {command} ({exc})", None))
    return found


def python_blocks() -> list[Block]:
    return [block for path in DOCS for block in code_blocks(path) if block.lang in ("python", "py")]


# The commands cheap enough to run on every test run (the zoo's mlp, one path): each must be shown in the docs.
CHEAP = [
    ["--help"],
    ["paths"],
    ["paths", "--device", "cpu", "--model", "mlp"],
    ["check", "--model", "mlp", "--path", "torch/onnx/ort"],
]


def test_docs_show_parity_commands_and_python():
    invocations = every_invocation()
    assert len(invocations) >= 40, [shown for shown, _ in invocations]
    assert len(python_blocks()) >= 5
    shown = [args for _, args in invocations]
    assert [args for args in CHEAP if args not in shown] == [], "a cheap command left the docs: update CHEAP"


@pytest.mark.parametrize("shown, args", every_invocation(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_documented_command_exists(shown, args):
    assert args is not None, f"not a shell command line: {shown}"
    try:
        check_invocation(args)
    except click.ClickException as exc:
        pytest.fail(f"{shown}\n  {exc.format_message()}")


@pytest.mark.parametrize(
    "args",
    [
        ["chek"],
        ["check", "--modle", "mlp"],
        ["check", "--precision", "fp8"],
        ["golden"],
        ["golden", "make"],
        ["compare", "a.json"],
        ["paths", "extra"],
        ["bench", "--batch-size", "one"],
        ["run", "--model"],
    ],
)
def test_a_drifted_command_is_caught(args):
    with pytest.raises(click.ClickException):
        check_invocation(args)


def test_shell_blocks_are_split_into_parity_calls():
    line = 'ray start --resources "$(parity worker-resources)" && parity check -m mlp --json - 2>/dev/null  # note'
    assert parity_invocations(line) == [["worker-resources"], ["check", "-m", "mlp", "--json", "-"]]
    block = Block(REPO / "README.md", 1, "console", "$ parity run \\\n    --model mlp\nmlp  torch  pass\n$ parity env")
    assert shell_commands(block) == ["parity run  --model mlp", "parity env"]


@pytest.mark.parametrize("args", CHEAP, ids=" ".join)
def test_cheap_documented_commands_run(args, tmp_path):
    workspace = zoo_copy(tmp_path, "mlp")
    done = subprocess.run(
        [sys.executable, "-m", "parity", *args], cwd=workspace, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip()


@pytest.mark.parametrize("block", python_blocks(), ids=Block.where)
def test_python_blocks_compile_and_runnable_ones_run(block):
    code = compile(block.text, block.where(), "exec")
    if block.runnable:
        exec(code, {"__name__": "docs_example"})  # noqa: S102 -- the docs' own example, run as a reader would


def test_mkdocs_builds_strictly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").read_text().count("--model") > 5
