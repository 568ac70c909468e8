"""Files and names: paths and tensor names outside ASCII (an emoji, CJK, a control character, a file name that is no
UTF-8), files that follow the umask, a full cache disk, and the tensors parity takes whole or refuses (an empty
tensor, a zero-row input, 2-bit outputs). ONNX graphs made with onnx.helper, ONNX's own backend test data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.platform import safefs
from parity.report.escape import visible
from tests.pipeline.test_check_onnx import onnx_model

onnx = pytest.importorskip("onnx")
MODELS = Path(__file__).parents[1] / "usermodels.py"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def save(path: Path, model=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model or onnx_model(), str(path))
    return path


# --------------------------------------------------------------------------- names outside ASCII


def test_a_folder_named_with_an_emoji_is_written_as_itself_and_checked(tmp_path):
    model = save(tmp_path / "📁" / "model.onnx")
    result = invoke("check-onnx", model, "--workspace", tmp_path / "ws")
    assert result.exit_code == 0, result.output
    (spec_file,) = (tmp_path / "ws" / "models").glob("*.py")
    spec = spec_file.read_text(encoding="utf-8")
    assert "📁/model.onnx" in spec and "\\ud83d" not in spec


def test_a_cjk_file_name_is_a_unicode_model_name(tmp_path):
    result = invoke(
        "check-onnx", save(tmp_path / "模型.onnx"), "--workspace", tmp_path / "ws", "--json", tmp_path / "r.json"
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ws" / "models" / "模型.py").is_file()
    assert json.loads((tmp_path / "r.json").read_text())["cases"][0]["name"] == "模型"


def test_a_terminal_that_cannot_encode_a_name_costs_no_case_its_results(tmp_path):
    """A latin-1 terminal, an emoji in one name and a file name that is no UTF-8 in another: every case is checked,
    shown with escapes, and written to the JSON and JUnit files."""
    save(tmp_path / "cases" / "emoji😀.onnx")
    save(tmp_path / "cases" / os.fsdecode(b"bad\xff.onnx"))
    save(tmp_path / "cases" / "plain.onnx")
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    done = subprocess.run(
        [sys.executable, "-m", "parity", "check-onnx", "cases", "--json", "r.json", "--junit-xml", "j.xml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=300,
    )
    out = done.stdout.decode("latin-1")
    assert done.returncode == 0, out + done.stderr.decode("latin-1")
    assert "Traceback" not in done.stderr.decode("latin-1")
    assert "emoji\\U0001f600.onnx" in out and "bad\\udcff.onnx" in out and "plain.onnx" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["verdict"] for r in report["results"]] == ["pass"] * 3
    assert (tmp_path / "j.xml").read_text().count("<testcase") == 3


def test_control_characters_in_names_are_escaped_on_the_terminal(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y\x1b[2J"])],
        "esc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y\x1b[2J", TensorProto.UINT2, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    save(tmp_path / "esc\x1b[31m.onnx", model)
    result = invoke("check-onnx", tmp_path / "esc\x1b[31m.onnx")
    assert "\x1b" not in result.output and "\x1b" not in result.stderr
    assert "esc\\x1b[31m.onnx" in result.output


def test_visible_escapes_what_a_terminal_acts_on_and_keeps_the_rest():
    assert visible("a\x1b[2Jb\x07\x9b\u202e") == "a\\x1b[2Jb\\x07\\x9b\\u202e"
    assert visible("模型 😀 café\nnext\tcol") == "模型 😀 café\nnext\tcol"
    assert visible("bad\udcff") == "bad\\udcff"


# --------------------------------------------------------------------------- the umask


@pytest.mark.parametrize(("mask", "file_mode", "folder_mode"), [(0o077, 0o600, 0o700), (0o022, 0o644, 0o755)])
def test_files_and_folders_written_atomically_follow_the_umask(tmp_path, mask, file_mode, folder_mode):
    old = os.umask(mask)
    try:
        safefs.write_text_atomic(tmp_path / "junit.xml", "<x/>")
        new = safefs.owned_tempdir(tmp_path, ".golden.build-")
        safefs.replace_dir(new, tmp_path / "golden")
    finally:
        os.umask(old)
    assert (tmp_path / "junit.xml").stat().st_mode & 0o777 == file_mode
    assert (tmp_path / "golden").stat().st_mode & 0o777 == folder_mode


def test_init_under_umask_077_writes_a_spec_only_its_owner_reads(tmp_path):
    old = os.umask(0o077)
    try:
        result = invoke(
            "check-onnx", save(tmp_path / "m.onnx"), "--workspace", tmp_path / "ws", "--json", tmp_path / "r.json"
        )
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    for written in (
        tmp_path / "ws" / "models" / "m.py",
        tmp_path / "r.json",
        *(tmp_path / "ws" / "golden").rglob("manifest.json"),
    ):
        assert written.stat().st_mode & 0o077 == 0, written


# --------------------------------------------------------------------------- a full cache disk


def test_a_full_cache_disk_is_named_where_a_worker_dies(tmp_path, monkeypatch):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (disk / "logs").mkdir()
        fill = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fill, b"\0" * 4096):
                pass
        except OSError:  # ENOSPC: the disk is full
            pass
        finally:
            os.close(fill)
        monkeypatch.setenv("PARITY_CACHE_DIR", str(disk))
        result = invoke("check-onnx", save(tmp_path / "m.onnx"), "--json", tmp_path / "r.json")
        reasons = [r["reason"] for r in json.loads((tmp_path / "r.json").read_text())["results"]]
        assert result.exit_code == 1, result.output
        assert reasons and f"the disk holding {disk} is full" in reasons[0], reasons
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# --------------------------------------------------------------------------- empty tensors, 2-bit outputs


def test_an_empty_tensor_input_is_taken_whole_as_a_value(tmp_path):
    import onnx.backend.test

    source = Path(onnx.backend.test.__file__).parent / "data" / "simple" / "test_sequence_model8"
    shutil.copytree(source, tmp_path / "seq8")  # X of shape (0,), split into an empty sequence
    result = invoke("check-onnx", tmp_path / "seq8", "--workspace", tmp_path / "ws")
    assert result.exit_code == 0, result.output
    spec = (tmp_path / "ws" / "models" / "seq8.py").read_text()
    assert 'InputSpec("X", (0,), layout="native", dtype="float32", batched=False)' in spec


def test_a_zero_row_input_or_eval_split_is_refused_at_init(tmp_path):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 4), np.float32))
    np.savez(tmp_path / "eval.npz", x=np.zeros((3, 4), np.float32), eval_x=np.zeros((0, 4), np.float32))
    for data, fragment in (("empty.npz", "input 'x'"), ("eval.npz", "eval_x has no rows")):
        result = invoke(
            "init", "net", "--workspace", tmp_path, "--torch", f"{MODELS}:make_net", "--inputs", tmp_path / data
        )
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert fragment in result.stderr and "no rows" in result.stderr, result.stderr


@pytest.mark.parametrize("element", ["UINT2", "INT2"])
def test_a_2_bit_output_is_refused_at_init_in_one_line(tmp_path, element):
    from onnx import TensorProto, helper

    to = getattr(TensorProto, element)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=to)],
        "cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", to, [3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    model.ir_version = 11
    result = invoke("init", "cast", "--workspace", tmp_path, "--onnx", save(tmp_path / "cast.onnx", model))
    assert result.exit_code == 2, result.output
    assert f"output 'y' is a {element.lower()} tensor; parity does not read 2-bit" in result.stderr
    assert "Traceback" not in result.output
