"""Generation with a KV cache, verified step by step: prompts, the float64 golden, the torch and ONNX Runtime
decoders, the consistency checks, and a model whose export restarts rotary positions at every call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.generation import onnx_export, tasks
from parity.generation.prompts import batches, positions, prompt_set
from parity.generation.verify import compare, consistency
from parity.platform.errors import UsageError

TOL = {"atol": 1e-4, "rtol": 1e-4}


def test_prompt_set_is_left_padded_and_distinct():
    p = prompt_set(256, (7, 4), seed=0)
    assert p["input_ids"].shape == (2, 7) and p["input_ids"].dtype == np.int64
    assert p["attention_mask"].tolist() == [[1] * 7, [0, 0, 0, 1, 1, 1, 1]]
    assert (p["input_ids"][1, :3] == 0).all() and (p["input_ids"][p["attention_mask"] == 1] >= 3).all()
    assert positions(p["attention_mask"], 7)[1].tolist() == [1, 1, 1, 0, 1, 2, 3]
    assert positions(np.ones((1, 9), np.int64), 1).tolist() == [[8]]
    b = batches(p)
    assert b["batch1"]["input_ids"].shape == (1, 7) and (b["batch1"]["input_ids"][0] == p["input_ids"][0]).all()
    short = batches(prompt_set(256, (3, 5), seed=1))["batch1"]
    assert short["input_ids"].shape == (1, 3) and short["attention_mask"].all()
    with pytest.raises(ValueError):
        prompt_set(256, (0, 4))


def _synthetic(steps=5, b=2, v=32, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(steps, b, v))
    return {"logits": logits, "tokens": logits.argmax(-1)}


def test_compare_names_the_first_departing_step_and_its_mode():
    gold = {"batch1": _synthetic(b=1, seed=1), "padded": _synthetic(seed=2)}
    same = {name: {"logits": g["logits"] + 1e-7, "tokens": g["tokens"].copy()} for name, g in gold.items()}
    result = compare(gold, same, TOL)
    assert result["verdict"] == "pass" and result["first_divergent_step"] is None and result["mode"] is None
    assert result["token_agreement"] == 1.0 and result["tol_units_max"] < 1
    bad = {name: {"logits": g["logits"].copy(), "tokens": g["tokens"].copy()} for name, g in same.items()}
    bad["padded"]["logits"][3, 1, 5] += 0.01  # step 3, row 1
    bad["padded"]["tokens"][4, 0] = (bad["padded"]["tokens"][4, 0] + 1) % 32
    result = compare(gold, bad, TOL)
    assert (result["verdict"], result["first_divergent_step"], result["mode"], result["batch"]) == (
        "fail",
        3,
        "decode",
        "padded",
    )
    assert result["first_divergent_token"] == 4 and result["token_agreement"] == pytest.approx(14 / 15)
    assert "step 3 (decode, padded)" in result["reason"] and result["kl_max"] > 0
    prefill = {name: {"logits": g["logits"].copy(), "tokens": g["tokens"]} for name, g in same.items()}
    prefill["batch1"]["logits"][0] *= 1.01
    assert compare(gold, prefill, TOL)["mode"] == "prefill"


def test_compare_reads_a_top_k_golden():
    full = _synthetic(steps=4, b=2, v=500, seed=3)
    order = np.argsort(-full["logits"], -1)[..., :16]
    top = full["logits"].max(-1)
    topk = {
        "tokens": full["tokens"],
        "topk_ids": order,
        "topk_logits": np.take_along_axis(full["logits"], order, -1),
        "lse": top + np.log(np.exp(full["logits"] - top[..., None]).sum(-1)),
    }
    path = {"padded": {"logits": full["logits"] + 1e-6, "tokens": full["tokens"]}}
    assert compare({"padded": topk}, path, TOL)["verdict"] == "pass"
    shifted = full["logits"].copy()
    shifted[2] += np.random.default_rng(4).normal(scale=0.5, size=shifted[2].shape)
    from_top = compare({"padded": topk}, {"padded": {"logits": shifted, "tokens": full["tokens"]}}, TOL)
    from_full = compare({"padded": full}, {"padded": {"logits": shifted, "tokens": full["tokens"]}}, TOL)
    assert from_top["first_divergent_step"] == from_full["first_divergent_step"] == 2
    assert 0 < from_top["kl_max"] <= from_full["kl_max"] + 1e-12  # the top-k KL is a lower bound of the full one


def test_consistency_fails_where_cache_and_no_cache_differ():
    a = np.linspace(-1, 1, 30).reshape(3, 10)
    checks = consistency({"cache_vs_full": (a, a + 1e-3), "batch1_vs_padded": (a, a), "chunked_prefill": None}, TOL)
    assert checks["cache_vs_full"]["ok"] is False and checks["batch1_vs_padded"]["ok"] is True
    assert checks["chunked_prefill"]["ok"] is None
    gold = {"padded": _synthetic()}
    path = {"padded": dict(gold["padded"]), "consistency": {"cache_vs_full": (a, a + 1e-3)}}
    result = compare(gold, path, TOL)
    assert result["verdict"] == "fail" and result["first_divergent_step"] is None
    assert result["reason"].startswith("consistency cache_vs_full fails")


def test_non_finite_path_fails_with_json_safe_numbers():
    gold = {"padded": _synthetic()}
    logits = gold["padded"]["logits"].copy()
    logits[1, 0, 0] = np.nan
    result = compare(gold, {"padded": {"logits": logits, "tokens": gold["padded"]["tokens"]}}, TOL)
    assert result["verdict"] == "fail" and result["first_divergent_step"] == 1
    import json

    json.dumps(result, allow_nan=False)


SOURCES = {
    "llama": {"torch": "tests/lmmodels.py:llama"},
    "faulty": {"torch": "tests/lmmodels.py:faulty_llama"},
    "qwen2": {"torch": "tests/lmmodels.py:qwen2"},
}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Per model: the source, the golden file, and (on first use) the ONNX export and its meta."""
    from tests import lmmodels

    base = tmp_path_factory.mktemp("generation")
    made: dict = {}

    def get(name: str, onnx: bool = False):
        if name not in made:
            if name == "hf-llama":
                source = {"hf": str(lmmodels.save(lmmodels.llama(), base / name))}
            else:
                source = {**SOURCES[name], "root": str(ROOT)}
            golden = base / f"{name}.npz"
            info = tasks.golden(source, str(golden), 6, [7, 4], 0)
            made[name] = {"source": source, "golden": str(golden), "info": info}
        entry = made[name]
        if onnx and "meta" not in entry:
            entry["dir"] = str(base / f"{name}-onnx")
            entry["meta"] = onnx_export.export_task(entry["source"], entry["dir"])
        return entry

    return get


def _check(entry, path_id):
    return tasks.check(entry["source"], entry["golden"], path_id, entry.get("dir"), entry.get("meta"), 1)


def test_golden_of_a_saved_folder(tiny):
    entry = tiny("hf-llama")
    info = entry["info"]
    assert (info["steps"], info["vocab"], info["n_layers"], info["kv_heads"], info["head_dim"]) == (6, 256, 2, 2, 16)
    assert all(c["ok"] for c in info["reference_consistency"].values())
    with np.load(entry["golden"]) as data:
        assert data["batch1/tokens"].shape == (6, 1) and data["padded/logits"].shape == (6, 2, 256)
        assert data["padded/logits"].dtype == np.float64 and data["prompts/input_ids"].shape == (2, 7)
        # batch 1 is row 0 of the padded batch, alone: the float64 reference generates the same tokens
        assert (data["batch1/tokens"][:, 0] == data["padded/tokens"][:, 0]).all()


def test_torch_path_passes_on_a_correct_model(tiny):
    result = _check(tiny("hf-llama"), "torch")
    generation = result["generation"]
    assert result["verdict"] == "pass", result["reason"]
    assert generation["first_divergent_step"] is None and generation["token_agreement"] == 1.0
    assert generation["tol_units_max"] < 0.1  # float32 against float64: far inside the tolerance
    assert all(c["ok"] for c in generation["consistency"].values())


def test_ort_path_passes_on_a_correct_model(tiny):
    entry = tiny("llama", onnx=True)
    assert entry["meta"]["inputs"][:3] == ["input_ids", "attention_mask", "position_ids"]
    result = _check(entry, "torch/onnx/ort")
    assert result["verdict"] == "pass", result["reason"]
    assert all(c["ok"] for c in result["generation"]["consistency"].values())
    assert result["generation"]["tol_units_max"] < 0.1


@pytest.mark.slow
def test_rotary_restart_fails_in_decode_on_ort_and_passes_on_torch(tiny):
    entry = tiny("faulty", onnx=True)
    assert _check(entry, "torch")["verdict"] == "pass"
    generation = _check(entry, "torch/onnx/ort")["generation"]
    assert generation["verdict"] == "fail"
    assert generation["first_divergent_step"] >= 1 and generation["mode"] == "decode"
    assert generation["per_step"][0]["tol_units"] < 1  # the prefill is right
    assert generation["consistency"]["cache_vs_full"]["ok"] is False


def test_large_vocabulary_keeps_the_top_k(tmp_path):
    source = {"torch": "tests/lmmodels.py:wide_llama", "root": str(ROOT)}
    golden = tmp_path / "wide.npz"
    info = tasks.golden(source, str(golden), 3, [5, 3], 1)
    assert info["logits"].startswith("top 64")
    with np.load(golden) as data:
        assert "padded/logits" not in data.files and data["padded/topk_ids"].shape == (3, 2, 64)
        assert len(str(data["padded/sha256"])) == 64
    result = tasks.check(source, str(golden), "torch", None, None, 1)
    assert result["verdict"] == "pass", result["reason"]


@pytest.mark.parametrize("saved", [True, False], ids=["folder", "factory"])
def test_gemma2_float64_reference_is_finite_and_exact(saved, tmp_path):
    """Gemma-2 runs eager attention, whose softmax transformers takes in float32: in a float64 reference a fully
    masked left pad turned into NaN. The float64 kernel keeps it finite and the reference's consistency exact."""
    from tests import lmmodels

    factory = {"torch": "tests/lmmodels.py:gemma2", "root": str(ROOT)}
    source = {"hf": str(lmmodels.save(lmmodels.gemma2(), tmp_path / "gemma2"))} if saved else factory
    info = tasks.golden(source, str(tmp_path / "g.npz"), 4, [7, 4], 0)
    assert all(c["ok"] and c["max_abs"] < 1e-12 for c in info["reference_consistency"].values())
    result = tasks.check(source, str(tmp_path / "g.npz"), "torch", None, None, 1)
    assert result["verdict"] == "pass", result["reason"]


def test_bad_requests_are_usage_errors(tiny, tmp_path):
    entry = tiny("hf-llama")
    with pytest.raises(UsageError, match="unknown generation path"):
        tasks.check(entry["source"], entry["golden"], "torch/tflite", None, None, 1)
    with pytest.raises(UsageError, match="needs the exported ONNX"):
        tasks.check(entry["source"], entry["golden"], "torch/onnx/ort", None, None, 1)
    with pytest.raises(UsageError, match="no config.json"):
        tasks.golden({"hf": str(tmp_path)}, str(tmp_path / "g.npz"), 2, [3], 0)


@pytest.mark.slow
def test_qwen2_passes_on_torch_and_ort(tiny):
    entry = tiny("qwen2", onnx=True)
    for path_id in ("torch", "torch/onnx/ort"):
        result = _check(entry, path_id)
        assert result["verdict"] == "pass", (path_id, result["reason"])


def test_a_zero_tolerance_never_lets_a_difference_pass():
    """An element exact on both sides is 0 units at any tolerance; a difference against a zero tolerance is not."""
    from parity.generation.verify import tol_units

    ref = np.array([[0.0, 1.0, 2.0]])
    assert tol_units(ref, ref.copy(), {"atol": 0.0, "rtol": 0.0}) == 0.0
    assert tol_units(ref, ref + [[0.5, 0, 0]], {"atol": 0.0, "rtol": 1e-4}) == float("inf")
    from parity.model.generation_spec import GenerationSpec
    from parity.platform.errors import SpecError

    with pytest.raises(SpecError, match="atol must be positive"):
        GenerationSpec(name="m", hf="x", tolerances={"atol": 0.0}).validate()


def test_a_factory_model_is_identified_by_its_classes_config_and_reference_not_its_weights_alone():
    """The faulty Llama holds the Llama's very weights: what tells them apart (for the golden's change check and the
    export cache's key) is the rotary class it swaps in and the factory it comes from."""
    from parity.generation.golden import source_identity

    root = str(Path(__file__).resolve().parents[2])
    good = source_identity({"torch": "tests/lmmodels.py:llama", "root": root})
    bad = source_identity({"torch": "tests/lmmodels.py:faulty_llama", "root": root})
    assert good["weights_sha256"] == bad["weights_sha256"] and good["config_sha256"] == bad["config_sha256"]
    assert good["classes_sha256"] != bad["classes_sha256"] and good != bad
    import json
    import subprocess
    import sys

    code = (  # another process imports the factory's file under another module name: the identity is the same
        "import json; from parity.generation.golden import source_identity; "
        f"print(json.dumps(source_identity({{'torch': 'tests/lmmodels.py:faulty_llama', 'root': {root!r}}})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == bad


def test_every_generation_path_has_one_record_in_check_order():
    from parity.generation import paths
    from parity.model.generation_spec import PATHS

    assert list(paths.PATHS) == list(PATHS)
