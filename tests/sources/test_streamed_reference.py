"""The float64 reference computed module by module (``parity.sources.torch_streamed``) against the model cast to float64
whole: the same values, bitwise (every operation runs on the same float64 values in the same order; the casts are
exact both ways), the model's float32 weights untouched after, the float64 bytes held at once bounded by the unit
budget, and a model that reads a weight outside its module's call caught and cast coarser."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from parity.golden import store  # noqa: E402
from parity.model import feeds  # noqa: E402
from parity.model.size import torch_weight_bytes  # noqa: E402
from parity.model.workspace import Workspace  # noqa: E402
from parity.sources import torch_streamed  # noqa: E402
from parity.sources.torch import TorchSource  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import lmmodels  # noqa: E402
import nestedmodels  # noqa: E402


def _state(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same_state(module, before: dict) -> bool:
    after = module.state_dict()
    return set(after) == set(before) and all(
        after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items()
    )


def _first(value):
    if torch.is_tensor(value):
        return value
    return value[0]


def _streamed_vs_whole(model, inputs: dict, budget: int):
    """(streamed output, whole output, streamer): the model run streamed in float64 at ``budget``, then a copy cast
    to float64 whole, on the same inputs; the model's own weights checked unchanged."""
    model.eval()
    before = _state(model)
    x = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    streamer = torch_streamed.Streamer(torch, model, budget=budget)
    with torch.inference_mode():
        streamed = _first(streamer.run(lambda: model(**x)))
    assert _same_state(model, before), "the streamed run changed the model's weights"
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()), "hooks left behind"
    whole = copy.deepcopy(model).double()
    with torch.inference_mode():
        reference = _first(whole(**x))
    return streamed, reference, streamer


def _tokens(vocab: int = 500):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 12), generator=generator)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _pixels(size: int):
    return {"pixel_values": torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))}


def _llama_tied():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def _bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(
        BertConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4)
    )


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    return DistilBertModel(DistilBertConfig(vocab_size=512, dim=64, hidden_dim=128, n_layers=3, n_heads=4))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_embd=64, n_layer=3, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _convnext():
    from transformers import ConvNextConfig, ConvNextModel

    torch.manual_seed(0)
    return ConvNextModel(ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], image_size=32))


MODELS = {
    "llama-tied": (_llama_tied, _tokens),
    "qwen2": (lmmodels.qwen2, lambda: _tokens(256)),
    "gemma2": (lmmodels.gemma2, lambda: _tokens(256)),
    "bert": (_bert, _tokens),
    "distilbert": (_distilbert, _tokens),
    "gpt2": (_gpt2, _tokens),
    "convnext": (_convnext, lambda: _pixels(32)),
    "nested-distilbert": (nestedmodels.make_faulty_distilbert, _tokens),
    "nested-residual-stack": (nestedmodels.make_residual_stack, lambda: {"x": torch.randn(2, 16)}),
    "nested-cnn-stages": (nestedmodels.make_cnn_stages, lambda: {"x": torch.randn(2, 3, 16, 16)}),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_streamed_reference_is_bitwise_the_whole_float64_model_and_holds_one_unit_at_a_time(name):
    factory, make_inputs = MODELS[name]
    model, inputs = factory(), make_inputs()
    total = torch_weight_bytes(model)
    streamed, whole, streamer = _streamed_vs_whole(model, inputs, budget=total // 16)
    assert streamed.dtype == torch.float64
    assert torch.equal(streamed, whole), f"max abs {(streamed - whole).abs().max().item():.3g}"
    assert streamer.stats.retries == 0 and streamer.reason is None
    assert len(streamer.units) > 1 and not streamer.whole
    # float64 bytes held at once: at most the largest unit and what the split modules hold for their calls,
    # each twice its float32 size, and far below the whole model in float64
    bound = 2 * (streamer.unit_bytes() + streamer.pinned_bytes())
    assert 0 < streamer.stats.peak_bytes <= bound
    assert streamer.stats.held_bytes == 0


def test_the_float64_bytes_held_at_once_follow_the_budget_not_the_model():
    model = _llama_tied()
    total = torch_weight_bytes(model)
    peaks = {}
    for parts in (4, 32):
        _, _, streamer = _streamed_vs_whole(model, _tokens(), budget=total // parts)
        peaks[parts] = streamer.stats.peak_bytes
    # six decoder layers and a tied embedding: the embedding (what model.dtype reads) is held for the whole call,
    # one layer at a time besides it
    embedding = model.model.embed_tokens.weight.nbytes
    layer = torch_weight_bytes(model.model.layers[0])
    assert peaks[32] <= 2 * (embedding + layer + torch_weight_bytes(model.model.norm) + 4096)
    assert peaks[32] < 2 * total / 2 and peaks[32] <= peaks[4]


def test_a_parent_that_reads_its_child_weight_is_cast_as_one_unit_and_says_why():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)
            self.c = torch.nn.Linear(8, 4)

        def forward(self, x):  # reads b's weight outside b's call
            return self.c(torch.relu(self.a(x)) @ self.b.weight.T)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Linear(4, 8)
            self.body = Scaled()
            self.head = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.head(self.body(self.stem(x)))

    torch.manual_seed(0)
    model = Net()
    streamed, whole, streamer = _streamed_vs_whole(model, {"x": torch.randn(3, 4)}, budget=200)
    assert torch.equal(streamed, whole)
    assert streamer.stats.coarsened == ["body"] and not streamer.whole
    assert "module 'body' cast to float64 as one unit" in streamer.reason
    assert "T read the float32 weight 'body.b.weight' outside its module's call" in streamer.reason


class _Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return x


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.rel = _Table()

    def forward(self, x):  # a child's weight read outside its call, through an op of its own before any mixing
        return self.lin(x) + self.rel.table.softmax(-1)[0]


def test_a_weight_read_outside_its_module_through_an_op_of_its_own_is_caught_not_promoted_silently():
    # float32 softmax of the table, then promoted to float64 by the addition: no dtype error of torch's own
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Linear(8, 8)
            self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))

        def forward(self, x):
            x = self.emb(x)
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    streamed, whole, streamer = _streamed_vs_whole(Net(), {"x": torch.randn(2, 8)}, budget=1)
    assert torch.equal(streamed, whole), f"max abs {(streamed - whole).abs().max().item():.3g}"
    assert streamer.stats.coarsened == ["blocks.0", "blocks.1", "blocks.2"] and not streamer.whole
    assert "softmax read the float32 weight 'blocks.2.rel.table' outside its module's call" in streamer.reason


def test_a_weight_read_the_model_catches_itself_is_caught_all_the_same():
    class Careless(_Block):
        def forward(self, x):
            try:
                bias = self.rel.table.exp()[0]
            except TypeError:  # a model that swallows the error: its result is not kept either
                bias = torch.zeros(8, dtype=x.dtype)
            return self.lin(x) + bias

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Careless())
    streamed, whole, streamer = _streamed_vs_whole(model, {"input": torch.randn(2, 8)}, budget=1)
    assert torch.equal(streamed, whole) and streamer.stats.coarsened == ["1"]


def test_an_alias_of_a_weight_read_even_with_the_whole_model_as_one_unit_is_raised():
    class Aliased(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.__dict__["scale"] = self.lin.weight  # kept outside any module's parameters: never cast by a unit

        def forward(self, x):
            return self.lin(x) @ self.scale.tanh()

    torch.manual_seed(0)
    model = Aliased()
    streamer = torch_streamed.Streamer(torch, model, budget=1)
    with (
        pytest.raises(torch_streamed.OutsideRead, match="tanh read the float32 weight 'lin.weight'"),
        torch.inference_mode(),
    ):
        streamer.run(lambda: model(torch.randn(2, 4, dtype=torch.float64)))
    assert streamer.whole and next(model.parameters()).dtype == torch.float32


def test_a_model_that_reads_its_own_dtype_from_its_first_parameter_streams_without_falling_back():
    class Typed(torch.nn.Module):  # as a Hugging Face model's ``self.dtype``: its first floating parameter's
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(6, 16)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
            self.head = torch.nn.Linear(16, 2)

        def forward(self, x):
            x = self.embed(x.to(next(self.parameters()).dtype))
            for block in self.blocks:
                x = torch.tanh(block(x))
            return self.head(x)

    torch.manual_seed(0)
    streamed, whole, streamer = _streamed_vs_whole(Typed(), {"x": torch.randn(3, 6)}, budget=1200)
    assert torch.equal(streamed, whole) and streamed.dtype == torch.float64
    assert streamer.stats.retries == 0 and len(streamer.units) == 6  # the list's blocks are units of their own


def test_a_model_that_casts_its_input_to_a_deep_weight_dtype_falls_back_to_the_whole_model():
    # transformers' ViTModel casts pixel_values to its patch projection's weight dtype before the embeddings run
    model = nestedmodels.make_faulty_vit()
    streamed, whole, streamer = _streamed_vs_whole(model, _pixels(16), budget=2000)
    assert torch.equal(streamed, whole)
    assert streamer.whole and streamer.reason.startswith("the whole model cast to float64 as one unit")


def test_a_failing_run_restores_every_weight_and_raises_the_model_own_error():
    class Fails(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x)
            raise ValueError("the model's own failure")
            return self.b(y)  # pragma: no cover

    model = Fails()
    before = _state(model)
    streamer = torch_streamed.Streamer(torch, model, budget=10)
    with pytest.raises(ValueError, match="own failure"):
        streamer.run(lambda: model(torch.randn(2, 4, dtype=torch.float64)))
    assert _same_state(model, before) and streamer.stats.held_bytes == 0 and streamer.stats.retries == 0


def test_the_mode_is_chosen_by_size_or_by_parity_reference(monkeypatch):
    monkeypatch.delenv(torch_streamed.ENV, raising=False)
    assert torch_streamed.choose(10 * 2**20)[0] == "whole"
    assert torch_streamed.choose(2 * 2**30)[0] == "streamed"
    monkeypatch.setenv(torch_streamed.ENV, "whole")
    assert torch_streamed.choose(2 * 2**30) == ("whole", "PARITY_REFERENCE=whole")
    monkeypatch.setenv(torch_streamed.ENV, "layered")
    with pytest.raises(torch_streamed.StreamingError, match="PARITY_REFERENCE='layered' is not one of auto"):
        torch_streamed.choose(1)


_TIED = """
import torch


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.b.weight = self.a.weight  # tied: one tensor
        self.register_buffer("scale", torch.ones(8, dtype=torch.bfloat16))  # 16-bit: counted as float32
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # not floating: not counted

    def forward(self, x):
        return self.b(self.a(x)) * self.scale.float()


def make():
    return Tied()
"""


def test_a_torch_model_size_counts_each_floating_weight_once_as_float32(tmp_path):
    """The size the step estimates read before a run (``parity.model.size``, on the meta device) is the one the
    torch source chooses its reference mode by: tied weights once, every floating element 4 bytes."""
    from click.testing import CliRunner

    from parity.cli import cli
    from parity.model import size

    (tmp_path / "tied.py").write_text(_TIED)
    args = ["init", "tied", "--torch", f"{tmp_path / 'tied.py'}:make", "--input", "x=2x8"]
    result = CliRunner().invoke(cli, [*args, "--workspace", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    estimated = size.weights_bytes(str(tmp_path), "tied")
    assert estimated == 4 * (8 * 8 + 8 + 8 + 8)  # a.weight (= b.weight), the two biases, the bfloat16 scale
    spec = Workspace(tmp_path).load_spec("tied", attach_golden=False)
    assert torch_weight_bytes(spec.torch_module()) == estimated


_ALIASED = """
import torch


class Aliased(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)
        self.__dict__["gate"] = self.a.weight  # an alias no module holds: never cast by a unit

    def forward(self, x):
        return self.b(self.a(x) @ self.gate.tanh())


def make():
    return Aliased()
"""


def test_a_golden_build_whose_model_reads_an_alias_of_a_weight_casts_it_whole_and_says_why(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from parity.cli import cli
    from parity.model import manifest as golden_manifest

    monkeypatch.setenv(torch_streamed.ENV, "streamed")
    (tmp_path / "aliased.py").write_text(_ALIASED)
    init = ["init", "aliased", "--torch", f"{tmp_path / 'aliased.py'}:make", "--input", "x=3x8"]
    for args in (init, ["golden", "build", "--model", "aliased"]):
        result = CliRunner().invoke(cli, [*args, "--workspace", str(tmp_path)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    reference = golden_manifest.read(tmp_path / "golden" / "aliased" / "manifest.json")["reference"]
    assert reference["dtype"] == "float64" and reference["mode"] == "whole"
    assert reference["mode_reason"].startswith("PARITY_REFERENCE=streamed; a streamed run read a weight outside")
    assert "tanh read the float32 weight 'a.weight'" in reference["mode_reason"]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_the_zoo_torch_source_streamed_gives_the_whole_reference_bitwise(name, monkeypatch):
    """Outputs, taps, gradients and a second batch size through ``TorchSource``, streamed and whole."""
    workspace = Workspace(REPO)
    spec = workspace.load_spec(name)
    arrays = store.load(workspace.golden_dir(name), spec).arrays
    x = feeds.from_arrays(spec, arrays["inputs.npz"])
    other = feeds.padded(spec, feeds.rows(spec, feeds.from_arrays(spec, arrays["eval.npz"]), 0, 3), 3)
    monkeypatch.setattr(torch_streamed, "MIN_UNIT", 0)  # units of a sixteenth of this small model
    results, records = {}, {}
    for mode in ("whole", "streamed"):
        monkeypatch.setenv(torch_streamed.ENV, mode)
        source = TorchSource(spec, arrays["weights.npz"], spec.batch_size, "float64")
        before = _state(source.module)
        found = {**source.run(x), **{f"tap/{k}": v for k, v in source.taps(x).items()}}
        found.update({f"other/{k}": v for k, v in source.run(other).items()})
        found.update({f"grad/{k}": v for k, v in source.gradients(x, arrays["inputs.npz"]["labels"]).items()})
        results[mode], records[mode] = found, source.reference_record()
        if mode == "streamed":
            assert _same_state(source.module, before)
            assert next(source.module.parameters()).dtype == torch.float32  # held in float32 between runs
    assert records == {
        "whole": {"mode": "whole", "why": "PARITY_REFERENCE=whole"},
        "streamed": {"mode": "streamed", "why": "PARITY_REFERENCE=streamed"},
    }
    assert set(results["whole"]) == set(results["streamed"])
    for key, value in results["whole"].items():
        assert value.dtype == results["streamed"][key].dtype == np.float64, key
        assert np.array_equal(value, results["streamed"][key]), key


def test_a_user_model_golden_records_the_reference_mode(tmp_path, monkeypatch):
    """``PARITY_REFERENCE`` reaches the golden build's workers; the manifest (schema-checked) says which ran."""
    from click.testing import CliRunner

    from parity.cli import cli

    monkeypatch.setenv(torch_streamed.ENV, "streamed")
    factory = f"{REPO / 'tests' / 'usermodels.py'}:make_net"
    for args in (["init", "net", "--torch", factory, "--input", "x=2x3x8x8"], ["golden", "build", "--model", "net"]):
        result = CliRunner().invoke(cli, [*args, "--workspace", str(tmp_path)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    from parity.model import manifest as golden_manifest

    manifest = golden_manifest.read(tmp_path / "golden" / "net" / "manifest.json")  # schema-checked
    reference = manifest["reference"]
    assert reference["dtype"] == "float64" and reference["mode"] == "streamed"
    assert reference["mode_reason"] == "PARITY_REFERENCE=streamed"
    monkeypatch.setenv(torch_streamed.ENV, "layered")
    result = CliRunner().invoke(cli, ["golden", "build", "--model", "net", "--workspace", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "PARITY_REFERENCE='layered' is not one of auto, streamed, whole" in result.output
    assert "Traceback" not in result.output
