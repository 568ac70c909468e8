"""A torch model declared with its safetensors files (``parity.model.weight_files``): the architecture built with no
weights, the files' tensors memory-mapped into it (ties kept, a write never reaching the file), the same model bit
for bit as the one transformers loads itself, a file that does not match said in one line; and through the CLI: a
golden build whose float64 reference streams from the mapping, bitwise the whole float64 model's, checked, and a
changed file refused."""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from parity.cli import cli  # noqa: E402
from parity.model import identity, weight_files  # noqa: E402

FACTORY = """
    from transformers import LlamaConfig, LlamaForCausalLM

    CONFIG = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True, use_cache=False)


    def make():
        return LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
"""


@pytest.fixture
def workspace(tmp_path):
    """A workspace with the factory, and the model's weights saved by ``save_pretrained`` in shards, with an index."""
    (tmp_path / "llama.py").write_text(textwrap.dedent(FACTORY))
    model = _factory(tmp_path)()
    torch.manual_seed(0)
    for p in model.parameters():  # weights no initialiser would give: nothing but the files can say them
        p.data.normal_(0, 0.2)
    model.save_pretrained(tmp_path / "weights", max_shard_size="60KB")
    return tmp_path, model


def _factory(root: Path):
    from parity.model.user import resolve

    return resolve("llama.py:make", root)


def _mapped_files(tensor) -> set[str]:
    """The files of the mappings the tensor's storage lies in (from ``/proc/self/maps``)."""
    address, found = tensor.untyped_storage().data_ptr(), set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end and len(fields) == 6:
            found.add(fields[5])
    return found


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_a_mapped_model_is_the_loaded_model_bit_for_bit_its_ties_kept_and_its_weights_pages_of_the_files(workspace):
    root, model = workspace
    from transformers import LlamaForCausalLM

    assert (root / "weights" / weight_files.INDEX).is_file() and len(weight_files.files(root / "weights")) >= 2
    mapped = weight_files.build(torch, _factory(root), root / "weights")
    loaded = LlamaForCausalLM.from_pretrained(root / "weights").eval()
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(_logits(mapped, ids), _logits(model, ids))
    assert torch.equal(_logits(mapped, ids), _logits(loaded, ids))
    assert mapped.lm_head.weight is mapped.model.embed_tokens.weight  # tied, as the architecture ties them
    shards = {str(p) for p in weight_files.files(root / "weights")}
    weight = mapped.model.layers[1].mlp.down_proj.weight
    assert _mapped_files(weight) & shards, "a weight is not a page of its file"
    assert not any(t.is_meta for t in (*mapped.parameters(), *mapped.buffers()))  # the rotary table built as usual
    assert identity.weights_digest(identity._torch_arrays(mapped), ordered=True) == identity.weights_digest(
        identity._torch_arrays(model)
    )

    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in map(Path, shards)}
    with torch.no_grad():
        weight.mul_(0)  # copy-on-write: the model's page changes, the file does not
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in before} == before


def test_a_bfloat16_checkpoint_is_cast_to_the_architectures_dtype_or_kept_for_the_streamed_reference(workspace):
    root, model = workspace
    model.to(torch.bfloat16).save_pretrained(root / "bf16")
    cast = weight_files.build(torch, _factory(root), root / "bf16")
    kept = weight_files.build(torch, _factory(root), root / "bf16", keep_dtypes=True)
    assert {p.dtype for p in cast.parameters()} == {torch.float32} and weight_files.built_dtypes(cast) is None
    assert {p.dtype for p in kept.parameters()} == {torch.bfloat16}
    assert set(weight_files.built_dtypes(kept).values()) == {"float32"}
    assert torch.equal(kept.model.norm.weight.float(), cast.model.norm.weight)
    # both are one model: the same digest, each weight read in the architecture's dtype
    digests = {identity.weights_digest(identity._torch_arrays(m), ordered=True) for m in (cast, kept)}
    assert len(digests) == 1


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        ("extra", r"holds 'extra\.weight', which the model does not have$"),
        ("missing", r"lacks 'model\.norm\.weight', which the model has$"),
        ("shape", r"'model\.norm\.weight' is \[31\] in the file and \[32\] in the model$"),
        ("garbage", r"is not a readable safetensors file"),
        ("empty", r"holds no \.safetensors file$"),
    ],
)
def test_files_that_do_not_match_the_model_are_one_line_naming_what_differs(tmp_path, spoil, said):
    from safetensors.torch import save_file

    (tmp_path / "llama.py").write_text(textwrap.dedent(FACTORY))
    state = {k: v.clone() for k, v in _factory(tmp_path)().state_dict().items() if k != "lm_head.weight"}
    folder = tmp_path / "w"
    folder.mkdir()
    if spoil == "extra":
        state["extra.weight"] = torch.zeros(2)
    elif spoil == "missing":
        del state["model.norm.weight"]
    elif spoil == "shape":
        state["model.norm.weight"] = torch.ones(31)
    if spoil == "garbage":
        (folder / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    elif spoil != "empty":
        save_file(state, folder / "model.safetensors")
    with pytest.raises(weight_files.WeightFilesError, match=said) as raised:
        weight_files.build(torch, _factory(tmp_path), folder)
    assert "\n" not in str(raised.value)


def test_a_non_persistent_buffer_an_older_checkpoint_saved_is_left_as_the_architecture_computes_it(workspace):
    from safetensors.torch import save_file

    root, model = workspace
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file({**state, "model.rotary_emb.inv_freq": torch.zeros(4)}, root / "old.safetensors")
    mapped = weight_files.build(torch, _factory(root), root / "old.safetensors")
    assert torch.equal(mapped.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)


def invoke(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, env=env)


def test_a_golden_build_streams_the_reference_from_the_files_and_a_check_refuses_them_changed(workspace):
    root, model = workspace
    made = invoke(
        "init", "lm", "--workspace", root, "--torch", f"{root / 'llama.py'}:make", "--weights", root / "weights",
        "--input", "input_ids=2x8:int64:300",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert 'torch_factory("llama.py:make", root=WORKSPACE, weights="weights")' in (root / "models/lm.py").read_text()
    built = invoke("golden", "build", "--workspace", root, "--model", "lm", env={"PARITY_REFERENCE": "streamed"})
    assert built.exit_code == 0, built.output
    golden = root / "golden" / "lm"
    manifest = json.loads((golden / "manifest.json").read_text())
    assert manifest["reference"]["mode"] == "streamed"
    assert manifest["reference"]["mode_reason"].endswith(f"its weights memory-mapped from {root / 'weights'}")
    assert "weights.npz" not in manifest["files"]  # no copy of the user's weights
    with np.load(golden / "inputs.npz") as inputs, np.load(golden / "reference.npz") as reference:
        whole = model.double()  # the whole model in float64: the reference streamed from the files is it, bitwise
        expected = _logits(whole, torch.from_numpy(inputs["x"])).numpy()
        assert np.array_equal(reference["logits"], expected)

    checked = invoke("check", "--workspace", root, "--model", "lm", "--path", "torch", "--path", "torch/onnx/ort")
    assert checked.exit_code == 0 and re.search(r"lm: 2 pass", checked.output), checked.output

    shard = weight_files.files(root / "weights")[0]
    from safetensors.torch import load_file, save_file

    tensors = load_file(shard)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1e-3  # fine-tuned: the same names and shapes, other values
    save_file(tensors, shard, metadata={"format": "pt"})
    refused = invoke("check", "--workspace", root, "--model", "lm", "--path", "torch")
    assert refused.exit_code == 2 and "the model's weights changed since its golden data was built" in refused.output


def test_a_transformers_folder_is_checked_from_its_config_and_its_mapped_weights(workspace):
    root, model = workspace
    made = invoke("init", "hf", "--workspace", root, "--hf", root / "weights")
    assert made.exit_code == 0, made.output
    spec = (root / "models" / "hf.py").read_text()
    assert 'torch_module=hf_model("weights", root=WORKSPACE)' in spec and '"input_ids", (64,)' in spec, spec
    assert invoke("golden", "build", "--workspace", root, "--model", "hf").exit_code == 0
    with np.load(root / "golden/hf/inputs.npz") as inputs, np.load(root / "golden/hf/reference.npz") as reference:
        assert np.array_equal(reference["logits"], _logits(model.double(), torch.from_numpy(inputs["x"])).numpy())
    checked = invoke("check", "--workspace", root, "--model", "hf", "--path", "torch")  # exported: the test above
    assert checked.exit_code == 0 and "hf: 1 pass" in checked.output, checked.output
    config = root / "weights" / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    changed = invoke("check", "--workspace", root, "--model", "hf", "--path", "torch")
    assert "the model's code changed since its golden data was built (weights/config.json)" in changed.output
    (root / "bad").mkdir()
    (root / "bad" / "config.json").write_text('{"vocab_size": 300}')
    refused = invoke("init", "bad", "--workspace", root, "--hf", root / "bad")
    assert refused.exit_code == 2 and "bad: no transformers config (ValueError: " in refused.output
    odd = json.loads(config.read_text()) | {"architectures": ["NoSuchForCausalLM"]}
    (root / "bad" / "config.json").write_text(json.dumps(odd))
    refused = invoke("init", "bad", "--workspace", root, "--hf", root / "bad")
    assert refused.exit_code == 2 and "names no transformers architecture (NoSuchForCausalLM)" in refused.output


def test_weights_are_declared_with_a_torch_factory_only(tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"")
    result = invoke("init", "m", "--workspace", tmp_path, "--onnx", "m.onnx", "--weights", tmp_path / "w.safetensors")
    assert result.exit_code == 2 and "--weights takes --torch MODULE:FUNCTION" in result.output
