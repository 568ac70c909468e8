"""The terminal report, from synthetic result dicts (no ML framework is imported)."""

from __future__ import annotations

from parity.report import terminal

PARAMS = ("dense1/kernel", "dense1/bias", "dense2/kernel", "dense2/bias", "logits/kernel", "logits/bias", "input:x")
LONG_FAIL = (
    "gradients differ for dense1/kernel, dense1/bias; worst gradient dense1/kernel: max_abs 0.000412 is 3.7x "
    "the tolerance, which is what a converter that folds the bias into the kernel in float32 looks like; "
    "SENTINEL-FAIL-END"
)
XERROR = (
    "tf2onnx could not convert op(s) XlaCallModule: ValueError: the op is serialised StableHLO and has no "
    "ONNX equivalent in this tf2onnx version SENTINEL-XERROR-END"
)


def stats(tol_units: float, max_abs: float) -> dict:
    return {
        "max_abs": max_abs,
        "max_rel": max_abs * 10,
        "mean_abs": max_abs / 3,
        "cosine": 1.0,
        "tol_units": tol_units,
        "ok": tol_units <= 1,
    }


def result(
    path: str,
    verdict: str = "pass",
    reason: str | None = None,
    *,
    ran: bool = True,
    grads: bool = True,
    bad_grads: int = 0,
    timed: bool = True,
    **extra,
) -> dict:
    r = {
        "model": "mlp",
        "path": path,
        "stages": path.split("/"),
        "device": "cpu",
        "precision": "fp32",
        "verdict": verdict,
        "reason": reason,
        "expected": False,
        "outputs": None,
        "gradients": None,
        "metrics": None,
        "deterministic": None,
        "timing": None,
    }
    if ran:
        r["outputs"] = {"logits": stats(0.154, 4.62e-06)}
        if grads:
            r["gradients"] = {name: stats(3.7 if i < bad_grads else 0.2, 1e-6) for i, name in enumerate(PARAMS)}
        r["metrics"] = {
            "accuracy": {"value": 0.9733, "golden": 0.9733, "ok": True},
            "argmax_agreement": 1.0,
            "argmax_agreement_ok": True,
            "ok": True,
        }
        r["deterministic"] = True
        if verdict == "pass" and timed:
            r["batch_size"] = 64
            r["timing"] = {"batches": {"64": {"verdict": "pass", "median_ms": 0.0342, "p90_ms": 0.04, "p99_ms": 0.05}}}
    r.update(extra)
    return r


def report(*results, model_errors=()) -> dict:
    return {"schema": "parity.result/1", "env": {}, "results": list(results), "model_errors": list(model_errors)}


def sample() -> dict:
    return report(
        result("torch"),
        result("torch/onnx/ort", grads=False),
        result("jax/tf", "fail", LONG_FAIL, bad_grads=2),
        result("tf/onnx/ort", "skip", "tf2onnx is not installed (pip install tf2onnx)", ran=False),
        result(
            "jax/tf/onnx/ort",
            "error",
            XERROR,
            ran=False,
            expected=True,
            expected_reason="jax2tf serialises through XlaCallModule, which tf2onnx cannot convert",
        ),
    )


def header(text: str) -> str:
    """The table's header row (after the line naming the device and precision, and a blank line)."""
    return text.splitlines()[2]


def row(text: str, path: str) -> str:
    return next(line for line in text.splitlines() if line.split()[1:2] == [path])


def test_timing_column_only_when_timed():
    timed, untimed = terminal.render(sample(), timed=True), terminal.render(sample(), timed=False)
    assert "median ms" in header(timed) and "0.034" in row(timed, "torch")
    assert "median ms" not in header(untimed) and "0.034" not in untimed
    for column in ("model", "path", "verdict", "tol×", "max_abs", "grads", "acc", "agree", "det", "reason"):
        assert column in header(untimed)


def test_plain_text_with_ascii_rule():
    text = terminal.render(sample(), timed=True)
    assert text.splitlines()[0].startswith("device cpu, precision fp32 (float32, TF32 off)")
    assert set(text.splitlines()[3]) == {"-"}
    assert "\x1b" not in text and not any(ch in text for ch in "─━│┃┌└")
    assert all(line == line.rstrip() for line in text.splitlines())


def test_row_cells():
    text = terminal.render(sample(), timed=False)
    assert row(text, "torch").split()[:10] == [
        "mlp",
        "torch",
        "pass",
        "0.154",
        "4.62e-06",
        "ok",
        "7",
        "0.9733",
        "1.000",
        "yes",
    ]
    assert "2 bad" in row(text, "jax/tf") and "FAIL" in row(text, "jax/tf")
    assert row(text, "torch/onnx/ort").split()[5] == "-"  # cannot differentiate
    assert "xerror" in row(text, "jax/tf/onnx/ort")


def test_legend_explains_columns_and_verdicts():
    text = terminal.render(sample(), timed=False)
    assert "atol + rtol·|golden|" in text and "at most 1 passes" in text
    assert "ok N" in text and "cannot differentiate" in text and "golden argmax" in text and "bitwise" in text
    for word in ("FAIL", "ERROR", "skip", "xerror", "XPASS"):
        assert f"{word}:" in text
    assert "passing paths only" not in text
    assert "passing paths only" in terminal.render(sample(), timed=True)


def test_failing_reason_shortened_in_table_and_full_in_reasons_block():
    text = terminal.render(sample(), timed=False)
    fail_row = row(text, "jax/tf")
    assert "SENTINEL-FAIL-END" not in fail_row and fail_row.endswith("… [1]")
    block = text[text.index("\nReasons\n") :]
    assert "[1] mlp jax/tf (FAIL): gradients differ" in block
    assert "SENTINEL-FAIL-END" in block
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if "[1]" in line)
    assert all(len(line) <= terminal.WRAP for line in lines[start : start + 4])
    assert lines[start + 1].startswith("      ") and lines[start + 1].strip()  # wrapped and indented


def test_xerror_and_skip_reasons_only_when_verbose():
    quiet = terminal.render(sample(), timed=False)
    assert "SENTINEL-XERROR-END" not in quiet and "(xerror)" not in quiet and "(skip)" not in quiet
    assert "--verbose" in quiet  # the shortened xerror reason says where the full one is
    verbose = terminal.render(sample(), timed=False, verbose=True)
    assert "SENTINEL-XERROR-END" in verbose
    assert "mlp jax/tf/onnx/ort (xerror): expected: tf2onnx could not convert" in verbose
    assert "mlp tf/onnx/ort (skip): tf2onnx is not installed" in verbose


def test_unexpected_pass_is_listed():
    declared = "jax2tf serialises through XlaCallModule, which tf2onnx cannot convert"
    text = terminal.render(
        report(result("jax/tf/onnx/ort", grads=False, unexpected_pass=True, expected_reason=declared)), timed=True
    )
    assert "XPASS" in row(text, "jax/tf/onnx/ort")
    assert "(XPASS): declared as expected error (jax2tf serialises" in text and "update the spec" in text


def test_summary_lines_and_model_errors_in_full():
    long_error = "models/broken.py: ModuleNotFoundError: No module named 'not_a_module_anywhere' " + "x" * 200
    text = terminal.render(
        report(*sample()["results"], model_errors=[{"model": "broken", "reason": long_error}]), timed=True
    )
    assert "mlp: 1 FAIL, 2 pass, 1 skip, 1 xerror | outputs ok 3/3, gradients ok 1/2, metrics ok 3/3" in text
    assert f"broken: ERROR {long_error}" in text


def test_no_results_prints_model_errors_only():
    text = terminal.render(
        report(model_errors=[{"model": "broken", "reason": "cannot import not_a_module_anywhere"}]), timed=True
    )
    assert text == "broken: ERROR cannot import not_a_module_anywhere"


def test_reason_with_brackets_is_not_markup():
    text = terminal.render(
        report(result("torch", "fail", "output [bold]logits[/bold]: shape (2,) != golden (3,)")), timed=False
    )
    assert "[bold]logits[/bold]" in text


def test_render_paths_is_a_matrix_with_numbered_reasons_and_notes():
    rows = [
        {"id": "torch", "device": "cpu", "precision": "fp32", "steps": "native", "reason": None, "note": ""},
        {
            "id": "torch",
            "device": "cpu",
            "precision": "tf32",
            "steps": "native",
            "reason": "no TF32 on a CPU",
            "note": "",
        },
        {
            "id": "torch/onnx/trt",
            "device": "cuda:0",
            "precision": "fp32",
            "steps": "torch.onnx -> trt build",
            "reason": "no NVIDIA GPU here",
            "note": "unverified here",
        },
        {
            "id": "torch/onnx/trt",
            "device": "cuda:0",
            "precision": "tf32",
            "steps": "torch.onnx -> trt build",
            "reason": "no NVIDIA GPU here",
            "note": "unverified here",
        },
    ]
    lines = terminal.render_paths(rows).splitlines()
    assert lines[0].split() == ["path", "device", "fp32", "tf32", "export", "chain"]
    assert set(lines[1]) == {"-"}
    assert lines[2].split() == ["torch", "cpu", "ok", "skip", "[1]", "native"]
    assert lines[3].split()[:6] == ["torch/onnx/trt", "cuda:0", "skip", "[2]", "skip", "[2]"]
    assert "  [1] no TF32 on a CPU" in lines and "  [2] no NVIDIA GPU here" in lines
    assert lines[-2:] == ["Notes", "  torch/onnx/trt: unverified here"]  # each note once, naming its paths


def test_a_non_deterministic_tensorrt_build_is_reported():
    report = {
        "results": [
            {
                "model": "mlp",
                "path": "torch/onnx/trt",
                "verdict": "pass",
                "outputs": {},
                "export": {"build_determinism": {"deterministic": False, "max_abs_diff": 3e-6}},
            }
        ],
        "model_errors": [],
    }
    lines = terminal.summary_lines(report)
    assert any("two TensorRT builds" in line and "3e-06" in line for line in lines)


def test_timed_legend_names_the_batch_size_of_median_ms():
    assert "checked batch size, batch 64;" in terminal.render(sample(), timed=True)


def test_stage_seconds_in_the_order_they_ran_and_absent_when_not_reported():
    seconds = {"bench": 75.0, "verify": 0.25, "check": 12.0, "export": 31.0}
    assert terminal.stage_seconds({"stage_seconds": seconds}) == (
        "Time by stage: verify 0.2 s, export 31.0 s, check 12.0 s, bench 1 min 15 s; 1 min 58 s in all"
    )
    assert terminal.stage_seconds(report()) == ""


def test_every_timing_table_has_a_legend_and_a_batch_column():
    from parity.report import timing_table

    r = result("torch")
    r["timing"] = {
        "batches": {
            "64": {
                "verdict": "pass",
                "median_ms": 0.5,
                "ci95_ms": [0.4, 0.6],
                "cv": 0.01,
                "runs": 30,
                "throughput": 128000.0,
                "vs_baseline": {"baseline": "torch", "self": True},
                "memory": {"peak_rss_mb": 40.0},
                "artifact_mb": None,
                "energy": {"joules_per_inference": None, "reason": "no RAPL here"},
            }
        },
        "train_step": {
            "verdict": "pass",
            "median_ms": 2.0,
            "steps_per_s": 500.0,
            "samples_per_s": 32000.0,
            "verified": {"worst": "dense1/kernel"},
        },
        "first_result": {
            "import_s": 1.0,
            "export_s": None,
            "load_s": 0.1,
            "first_inference_s": 0.01,
            "second_inference_s": 0.001,
            "first_backward_s": 0.02,
            "path_peak_mb": 12.0,
        },
    }
    text = timing_table.render(report(r))
    blocks = text.split("\n\n")
    tables = [b for b in blocks if "\n--" in b]
    assert len(tables) == 4  # per batch, memory and energy, training step, first result
    for table in tables:
        lines = table.splitlines()
        head = next(line for i, line in enumerate(lines) if set(lines[i + 1]) == {"-"})
        assert "batch" in head.split(), head  # every figure in the table is at the row's batch size
        legend = blocks[blocks.index(table) + 1]
        assert legend.startswith("  batch "), legend
    assert "samples/s    batch / median" in text and "steps/s    1000 / median ms" in text


def test_what_each_compiler_and_runtime_did_is_one_line_per_path_after_the_table():
    """A deployment runtime's one-line summary (recompilations, the precision OpenVINO ran at) is printed after the
    verdicts; a path without a runtime record adds nothing."""
    compiled = result("torch/compile", runtime={"summary": "4 graphs compiled, 3 recompilations, 0 graph breaks"})
    text = terminal.render(report(result("torch"), compiled), timed=False)
    block = text.split("What the compilers and runtimes did")[1]
    assert "  mlp torch/compile: 4 graphs compiled, 3 recompilations, 0 graph breaks" in block
    assert "mlp torch:" not in block
    assert "What the compilers" not in terminal.render(report(result("torch")), timed=False)
