"""OpenVINO (stateful, from the package's ONNX export) and ONNX Runtime GenAI (its builder and Generator) as generation
paths: each step against torch float32 with the transformers cache, on a tiny random Llama with a word-level
tokenizer."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from parity.generation.prompts import batches, prompt_set
from parity.platform.errors import Unavailable

NEW_TOKENS = 6
TOL = 1e-4
HAS_GENAI = importlib.util.find_spec("onnxruntime_genai") is not None
needs_genai = pytest.mark.skipif(not HAS_GENAI, reason="onnxruntime-genai is not installed")


def tiny_tokenizer(folder, vocab: int) -> None:
    """A word-level tokenizer over ``w3``..``w{vocab-1}`` (ids 0, 1, 2: pad, bos, eos), saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(3, vocab)}
    words.update({"<pad>": 0, "<s>": 1, "</s>": 2})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )
    fast.save_pretrained(folder)


def save_llama(folder, tokenizer: bool = True) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(42)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    if tokenizer:
        tiny_tokenizer(folder, config.vocab_size)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The folder, its float32 torch decoder, the ONNX export and its meta, and the prompt batches."""
    from parity.generation.model import load
    from parity.generation.onnx_export import export
    from parity.generation.torch_decoder import TorchDecoder

    root = tmp_path_factory.mktemp("llama")
    folder = root / "hf"
    save_llama(folder)
    model = load({"hf": str(folder)}, "float32")
    meta = export(model, root / "model.onnx")
    prompts = batches(prompt_set(256, lengths=(7, 4), seed=0))
    return {
        "folder": folder,
        "root": root,
        "torch": TorchDecoder(model),
        "onnx": root / "model.onnx",
        "meta": meta,
        "prompts": prompts,
    }


@pytest.fixture(scope="module")
def openvino(llama):
    from parity.generation.openvino_decoder import OpenVINODecoder

    return OpenVINODecoder(llama["onnx"], llama["meta"], threads=1)


@pytest.fixture(scope="module")
def genai(llama):
    from parity.generation.genai_decoder import GenAIDecoder, genai_export

    out = llama["root"] / "genai"
    meta = genai_export({"hf": str(llama["folder"])}, str(out))
    return meta, GenAIDecoder(out, threads=1)


def reference(llama, name):
    batch = llama["prompts"][name]
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits, tokens = llama["torch"].steps(ids, mask, NEW_TOKENS)
    return ids, mask, logits, tokens


def per_step(a, b) -> list[float]:
    return [float(np.abs(x - y).max()) for x, y in zip(a, b)]


@pytest.mark.parametrize("name", ["batch1", "padded"])
def test_openvino_stateful_matches_torch_per_step(llama, openvino, name):
    ids, mask, ref_logits, ref_tokens = reference(llama, name)
    logits, tokens = openvino.steps(ids, mask, NEW_TOKENS, forced=ref_tokens)
    assert logits.shape == ref_logits.shape and logits.dtype == np.float64
    assert max(per_step(logits, ref_logits)) < TOL, per_step(logits, ref_logits)
    assert np.array_equal(tokens, ref_tokens)
    _, free = openvino.steps(ids, mask, NEW_TOKENS)
    assert np.array_equal(free, ref_tokens)


def test_openvino_full_and_chunked_agree_with_the_cache(llama, openvino):
    ids, mask, ref_logits, _ = reference(llama, "padded")
    full = openvino.full(ids, mask)
    torch_full = llama["torch"].full(ids, mask)
    real = mask == 1  # a pad's logits are the model's own business
    assert full.shape == torch_full.shape
    assert np.abs(full - torch_full)[real].max() < TOL
    chunked = openvino.chunked(ids, mask, 4)
    assert np.abs(chunked - ref_logits[0]).max() < TOL
    # a second sequence starts from an empty cache: the states are reset, not extended
    again, _ = openvino.steps(ids, mask, 2, forced=None)
    assert np.abs(again - ref_logits[:2]).max() < TOL


def test_openvino_compiles_stateful_at_f32(openvino, llama):
    record = openvino.record()
    assert record["inference_precision"]["ran"] == "f32"
    assert record["states"] == 2 * llama["meta"]["n_layers"]
    assert "past_key_values.0.key" not in openvino.inputs  # the cache is inside the model


@needs_genai
def test_genai_matches_torch_at_batch_one(llama, genai):
    meta, decoder = genai
    assert meta["format"] == "onnxruntime-genai" and (llama["root"] / "genai" / meta["log"]).is_file()
    ids, mask, ref_logits, ref_tokens = reference(llama, "batch1")
    logits, tokens = decoder.steps(ids, mask, NEW_TOKENS, forced=ref_tokens)
    assert max(per_step(logits, ref_logits)) < TOL, per_step(logits, ref_logits)
    assert np.array_equal(tokens, ref_tokens)
    _, free = decoder.steps(ids, mask, NEW_TOKENS)
    assert np.array_equal(free, ref_tokens)
    assert np.abs(decoder.full(ids, mask) - llama["torch"].full(ids, mask)).max() < TOL
    assert np.abs(decoder.chunked(ids, mask, 3) - ref_logits[0]).max() < TOL


@needs_genai
def test_genai_reads_a_left_padded_batch_as_right_padded(llama, genai):
    """GenAI's attention counts a row's pads as trailing: the unpadded row is right, the left-padded one departs from
    the prefill on (by ~0.4 here, far above the 1e-4 the other rows meet)."""
    _, decoder = genai
    ids, mask, ref_logits, ref_tokens = reference(llama, "padded")
    assert mask[0].all() and not mask[1].all()
    logits, _ = decoder.steps(ids, mask, NEW_TOKENS, forced=ref_tokens)
    assert max(per_step(logits[:, 0], ref_logits[:, 0])) < TOL
    assert float(np.abs(logits[0, 1] - ref_logits[0, 1]).max()) > 1e-2
    # the same rows moved to right padding are read right: the departure is the padding side, nothing else
    right_ids, right_mask = np.zeros_like(ids), np.zeros_like(mask)
    for row in range(ids.shape[0]):
        real = ids[row][mask[row] == 1]
        right_ids[row, : len(real)], right_mask[row, : len(real)] = real, 1
    right, _ = decoder.steps(right_ids, np.ones_like(mask), 1)
    assert np.abs(right[0] - ref_logits[0]).max() < TOL


@needs_genai
def test_genai_chunked_prefill_equals_one_prefill_at_any_batch(llama, genai):
    _, decoder = genai
    ids, mask, _, _ = reference(llama, "padded")
    one, _ = decoder.steps(ids, mask, 1)
    assert np.abs(decoder.chunked(ids, mask, 5) - one[0]).max() < TOL


@needs_genai
@pytest.mark.parametrize("name", ["batch1", "padded"])
def test_genai_teacher_forcing_goes_on_past_the_end_of_sequence_id(llama, genai, name):
    """The model's eos id (2) fed mid-sequence: GenAI would finish the row and repeat its last logits."""
    _, decoder = genai
    ids, mask, _, ref_tokens = reference(llama, name)
    forced = ref_tokens.copy()
    forced[1] = 2
    ref_logits, _ = llama["torch"].steps(ids, mask, NEW_TOKENS, forced=forced)
    logits, _ = decoder.steps(ids, mask, NEW_TOKENS, forced=forced)
    assert max(per_step(logits[:, 0], ref_logits[:, 0])) < TOL, per_step(logits[:, 0], ref_logits[:, 0])


@needs_genai
def test_tasks_check_runs_openvino_and_genai_paths(llama, genai, tmp_path):
    from parity.generation import tasks

    source = {"hf": str(llama["folder"])}
    golden = tmp_path / "golden.npz"
    tasks.golden(source, str(golden), NEW_TOKENS, [7, 4], 0)
    ov = tasks.check(source, str(golden), "torch/onnx/openvino", str(llama["root"]), llama["meta"], 1)
    assert ov["verdict"] == "pass", ov["reason"]
    gen = tasks.check(source, str(golden), "torch/genai", str(llama["root"] / "genai"), genai[0], 1)
    assert gen["verdict"] == "fail"  # the left-padded batch, read as right-padded


def test_genai_export_needs_a_folder_with_a_tokenizer(tmp_path):
    from parity.generation.genai_decoder import genai_export

    save_llama(tmp_path / "hf", tokenizer=False)
    with pytest.raises(Unavailable, match="needs a tokenizer"):
        genai_export({"hf": str(tmp_path / "hf")}, str(tmp_path / "out"))
    with pytest.raises(Unavailable, match="save_pretrained folder"):
        genai_export({"torch": "lm.py:build", "root": str(tmp_path)}, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
