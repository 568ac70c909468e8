"""``torch/export`` and ``torch/executorch``: the static-cache program of transformers' ExecuTorch wrapper, saved with
torch.export (run eagerly) and lowered to XNNPACK (run by the ExecuTorch runtime), verified step by step against the
float64 golden of the tiny Llama."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.generation import export_decoder, paths, tasks
from parity.generation.prompts import batches, prompt_set
from parity.platform.errors import UsageError

sys.path.insert(0, str(Path(__file__).parents[1]))
import lmmodels

HAS_EXECUTORCH = importlib.util.find_spec("executorch") is not None
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny Llama's folder, its float64 golden and the torch/export program."""
    root = tmp_path_factory.mktemp("gen_export")
    source = {"hf": str(lmmodels.save(lmmodels.llama(), root / "llama"))}
    golden = root / "golden.npz"
    tasks.golden(source, str(golden), NEW_TOKENS, [7, 4], 0)
    (root / "pt2").mkdir()
    meta = export_decoder.export(source, str(root / "pt2"))
    return {"source": source, "golden": str(golden), "dir": str(root / "pt2"), "meta": meta, "root": root}


def test_export_writes_a_loadable_program_not_a_pickle(tiny):
    meta = tiny["meta"]
    assert meta["format"] == "pt2" and meta["batch"] == 1
    assert meta["max_cache_len"] == 512  # the tiny Llama's max_position_embeddings, under the limit
    with open(Path(tiny["dir"]) / meta["file"], "rb") as f:
        assert f.read(2) == b"PK"  # torch.export.save's archive
    json.dumps(meta)


def test_export_path_passes_against_the_golden(tiny):
    result = tasks.check(tiny["source"], tiny["golden"], "torch/export", tiny["dir"], tiny["meta"], 1)
    generation = result["generation"]
    assert result["verdict"] == "pass", result["reason"]
    assert generation["first_divergent_step"] is None and generation["token_agreement"] == 1.0
    assert {r["mode"] for r in generation["per_step"]} == {"prefill", "decode"}
    checks = generation["consistency"]
    assert checks["cache_vs_full"]["ok"] and checks["chunked_prefill"]["ok"]
    assert checks["batch1_vs_padded"]["ok"] is None  # rows run one at a time: nothing padded to compare


def test_static_cache_decoder_matches_torch_with_its_cache(tiny):
    """Free-running and teacher-forced steps, ``full`` and ``chunked`` against eager torch float32 with the
    transformers cache, on the left-padded batch run row by row."""
    from parity.generation.model import load
    from parity.generation.torch_decoder import TorchDecoder

    decoder = paths.decoder("torch/export", tiny["dir"], tiny["meta"], 1)
    reference = TorchDecoder(load(tiny["source"], "float32"))
    padded = batches(prompt_set(256, [7, 4], 3))["padded"]
    ids, mask = padded["input_ids"], padded["attention_mask"]
    want, want_tokens = reference.steps(ids, mask, 4)
    got, tokens = decoder.steps(ids, mask, 4)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    forced = (want_tokens + 1) % 256
    np.testing.assert_allclose(
        decoder.steps(ids, mask, 4, forced)[0], reference.steps(ids, mask, 4, forced)[0], atol=1e-4, rtol=1e-4
    )
    full = decoder.full(ids, mask)
    assert np.isnan(full[1, :3]).all()  # the short row's pads: never run
    np.testing.assert_allclose(full[mask == 1], reference.full(ids, mask)[mask == 1], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(decoder.chunked(ids, mask, 5), want[0], atol=1e-4, rtol=1e-4)


def test_a_run_longer_than_the_static_cache_is_refused(tiny):
    decoder = paths.decoder("torch/export", tiny["dir"], {**tiny["meta"], "max_cache_len": 8}, 1)
    ids = np.arange(3, 9, dtype=np.int64)[None]
    with pytest.raises(UsageError, match="static cache holds 8 positions; .* need 9"):
        decoder.steps(ids, np.ones_like(ids), 4)


def test_a_model_torch_export_cannot_take_is_unavailable(tmp_path):
    """A model whose final norm branches on its values: torch.export refuses it, said as the path's reason."""
    (tmp_path / "branchy.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parents[1])!r})\nimport lmmodels\n\n"
        "def build():\n    model = lmmodels.llama()\n    norm = model.model.norm\n    plain = norm.forward\n"
        "    def forward(hidden):\n        return plain(hidden) if float(hidden.sum()) > 0 else -plain(hidden)\n"
        "    norm.forward = forward\n    return model\n"
    )
    meta = export_decoder.export({"torch": "branchy.py:build", "root": str(tmp_path)}, str(tmp_path))
    assert "static-cache wrapper failed" in meta.get("unavailable", ""), meta
    assert not (tmp_path / export_decoder.PT2_FILE).exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_EXECUTORCH, reason="executorch is not installed")
def test_executorch_path_passes_against_the_golden(tiny):
    from parity.generation import executorch_decoder

    out = tiny["root"] / "pte"
    out.mkdir()
    meta = executorch_decoder.export(tiny["source"], str(out))
    assert meta["format"] == "pte" and meta["delegation"]["delegated_nodes"] > 0, meta
    result = tasks.check(tiny["source"], tiny["golden"], "torch/executorch", str(out), meta, 1)
    generation = result["generation"]
    assert result["verdict"] == "pass", result["reason"]
    assert generation["token_agreement"] == 1.0 and generation["first_divergent_step"] is None
    assert generation["consistency"]["cache_vs_full"]["ok"] and generation["consistency"]["chunked_prefill"]["ok"]
    assert generation["consistency"]["batch1_vs_padded"]["ok"] is None
