"""``parity.report.compare``: two hand-made result files compared (no ML framework is imported)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from parity.platform.errors import UsageError
from parity.report import compare


def env(**changes) -> dict:
    e = {
        "python": "3.11.9",
        "platform": "Linux-6.8",
        "packages": {"numpy": "2.1.0", "torch": "2.13.0"},
        "cpu": "Xeon",
        "cpu_count": 2,
        "gpu": None,
        "threads": 2,
        "flags": {},
    }
    for key, value in changes.items():
        if key == "torch":
            e["packages"] = {**e["packages"], "torch": value}
        else:
            e[key] = value
    return e


def samples(median_ms: float, seed: int, n: int = 60, sigma: float = 0.05) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for x in np.exp(rng.normal(np.log(median_ms), sigma, n))]


def timing2(batches: dict[int, list[float]]) -> dict:
    out = {}
    for batch, ms in batches.items():
        arr = np.asarray(ms)
        med = float(np.median(arr))
        out[str(batch)] = {
            "median_ms": med,
            "mean_ms": float(arr.mean()),
            "std_ms": float(arr.std(ddof=1)),
            "cv": float(arr.std(ddof=1) / arr.mean()),
            "p90_ms": float(np.percentile(arr, 90)),
            "p99_ms": float(np.percentile(arr, 99)),
            "min_ms": float(arr.min()),
            "ci95_ms": [med * 0.98, med * 1.02],
            "runs": len(ms),
            "throughput": batch / med * 1e3,
            "samples_ms": list(ms),
        }
    return {"batches": out}


def res(path: str, verdict: str = "pass", model: str = "mlp", timing=None, **extra) -> dict:
    r = {
        "model": model,
        "path": path,
        "stages": path.split("/"),
        "device": "cpu",
        "precision": "fp32",
        "verdict": verdict,
        "reason": None,
        "expected": False,
        "timing": timing,
    }
    r.update(extra)
    return r


def doc(*results, schema: str = "parity.result/2", **env_changes) -> dict:
    return {"schema": schema, "env": env(**env_changes), "results": list(results), "model_errors": []}


def write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def compared(tmp_path, a: dict, b: dict) -> str:
    text, code = compare.render(compare.load(write(tmp_path, "A.json", a)), compare.load(write(tmp_path, "B.json", b)))
    assert code == 0
    return text


def timing_row(text: str, path: str, batch: str = "64") -> str:
    (row,) = [line for line in text.splitlines() if f" {path} " in line and f" {batch} " in line]
    return row


def test_environment_differences_come_first_and_flattened(tmp_path):
    a = doc(res("torch/eager", timing=timing2({64: samples(2.0, 1)})))
    b = doc(res("torch/eager", timing=timing2({64: samples(2.0, 2)})), torch="2.14.0", threads=4)
    text = compared(tmp_path, a, b)
    lines = text.splitlines()
    assert lines[0] == "Environment (A -> B)"
    assert "  packages.torch: 2.13.0 -> 2.14.0" in lines[:5]
    assert "  threads: 2 -> 4" in lines[:5]
    assert text.index("packages.torch") < text.index("Verdicts") < text.index("Timing")
    assert any(line.startswith("warning: threads differ: 2 -> 4") for line in lines)


def test_same_environment_and_row_warnings(tmp_path):
    a = doc(res("torch/onnx/ort", timing=timing2({64: samples(2.0, 1)})))
    b = doc(res("torch/onnx/ort", precision="fp16", device="cuda", timing=timing2({32: samples(1.0, 2)})))
    text = compared(tmp_path, a, b)
    assert "  same environment" in text
    (warning,) = [line for line in text.splitlines() if line.startswith("warning:")]
    assert "mlp torch/onnx/ort" in warning
    assert "precision fp32 -> fp16" in warning and "device cpu -> cuda" in warning and "batch size 64 -> 32" in warning
    assert "no path timed in both" in text  # no common batch: nothing invented


def test_verdict_changes_new_and_missing_paths(tmp_path):
    a = doc(res("torch/eager"), res("torch/onnx/ort"), res("tf/eager"))
    b = doc(res("torch/eager"), res("torch/onnx/ort", verdict="fail"), res("jax/eager", verdict="error"))
    text = compared(tmp_path, a, b)
    verdicts = text[text.index("Verdicts") : text.index("Timing")]
    assert "pass -> FAIL" in verdicts and "torch/onnx/ort" in verdicts
    assert "missing in B" in verdicts and "tf/eager" in verdicts
    assert "new in B" in verdicts and "jax/eager" in verdicts
    assert "torch/eager" not in verdicts  # unchanged rows are not listed
    assert "1 of 2 paths in both unchanged" in verdicts


def test_significant_slowdown_and_no_significant_difference(tmp_path):
    a = doc(
        res("torch/eager", timing=timing2({64: samples(2.0, 1), 128: samples(4.0, 3)})),
        res("torch/onnx/ort", timing=timing2({64: samples(1.0, 5, n=30, sigma=0.3)})),
    )
    b = doc(
        res("torch/eager", timing=timing2({64: samples(3.0, 2), 128: samples(4.0, 4)})),
        res("torch/onnx/ort", timing=timing2({64: samples(1.0, 6, n=30, sigma=0.3)})),
    )
    text = compared(tmp_path, a, b)
    slow = timing_row(text, "torch/eager", "64")
    assert slow.rstrip().endswith("slower")
    ratio = float(slow.split()[5])
    assert 1.4 < ratio < 1.6
    lo, hi = (float(x) for x in slow[slow.index("[") + 1 : slow.index("]")].split(","))
    assert 1 < lo < ratio < hi
    for path, batch in (("torch/eager", "128"), ("torch/onnx/ort", "64")):
        row = timing_row(text, path, batch)
        assert row.rstrip().endswith("no significant difference")
        lo, hi = (float(x) for x in row[row.index("[") + 1 : row.index("]")].split(","))
        assert lo <= 1 <= hi


@pytest.mark.parametrize(
    "content, message",
    [
        ({"results": []}, "not a parity result (no 'schema' field)"),
        (
            {"schema": "parity.result/9", "results": []},
            "result schema 'parity.result/9' is not one this parity reads (parity.result/2)",
        ),
        (
            {"schema": "parity.result/1", "results": []},
            "result schema 'parity.result/1' is older than this parity reads",
        ),
        ({"schema": "parity.result/2"}, "not a parity result (no 'results' field)"),
        ([1, 2], "not a parity result (a JSON list, not an object)"),
        ("{not json", "not a parity result (not valid JSON"),
        ('{"schema": "parity.result/2", "results": [], "x": NaN}', "non-standard JSON constant NaN"),
        ({"schema": "parity.result/2", "results": [{"model": "mlp"}]}, "results[0] has no 'model' and 'path'"),
    ],
)
def test_bad_inputs_name_the_file(tmp_path, content, message):
    path = write(tmp_path, "B.json", content)
    with pytest.raises(UsageError) as info:
        compare.load(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_missing_and_oversized_files(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match=r"nope\.json: cannot read"):
        compare.load(tmp_path / "nope.json")
    path = write(tmp_path, "A.json", doc())
    monkeypatch.setattr(compare, "MAX_BYTES", 10)
    with pytest.raises(UsageError, match=r"A\.json: larger than"):
        compare.load(path)


def test_different_models_compare_nothing(tmp_path):
    a = doc(res("torch/eager", timing=timing2({64: samples(2.0, 1)})))
    b = doc(res("torch/eager", model="cnn", timing=timing2({64: samples(9.0, 2)})), res("tf/eager", model="resnet"))
    text = compared(tmp_path, a, b)
    assert text.splitlines()[-1] == "different models: A has mlp, B has cnn and resnet; nothing to compare"
    assert "Verdicts" not in text and "Timing" not in text
