#!/usr/bin/env python
"""What a diagnosis costs next to a plain check of the same path, measured side by side in one run.

The worker pool keeps one framework process alive at a time, so each piece is timed in a warm worker: the plain
check (outputs twice, the eval split, gradients where the path has them), then whole diagnoses back to back, each
piece timed as ``chain.diagnose`` runs it: the path's taps (its plain run, on ONNX Runtime the check's own outputs,
and one inference with the tap tensors and, where a descent follows in the same worker, every module's tensors as
extra outputs, which the descent reads too); the source's own taps (the converter link); the descent into the
model's tree (one task in the source's worker: every level on the reference and on the path, the leaf's cause, and
on an ONNX graph the runtime link on the leaf's nodes); the runtime link's own task where the descent did not link
(ONNX Runtime and the reference evaluator on the whole graph); and the analysis in the orchestrator (statistics,
first divergent tap, the cause's layer recomputations). Prints medians and ratios to the plain check.

``--encoder N`` measures a user's model instead: a transformers DistilBERT encoder of N layers (random weights)
whose ``N//2``-th layer's output LayerNorm loses its bias in the export, through ``parity init`` and
``golden build`` in a temporary workspace, so its ONNX path fails and the descent goes to that leaf.

``--llama SIZE`` measures a transformers Llama of random weights (``LLAMA``: ``20m``, ``135m``, SmolLM-135M's shape,
or ``1.1b``, TinyLlama-1.1B's) on 2x64 tokens, whose middle layer's ``post_attention_layernorm`` (an RMSNorm of
random gain) is exported with epsilon 0.1, so ``torch/onnx/ort`` fails and the descent goes to that leaf.

``--keras-encoder N`` and ``--flax-encoder N`` measure models of a realistic size, where compute and not fixed setup
dominates: a Keras encoder of N blocks (attention, feed-forward, norms) and a Flax linen encoder of N feed-forward
blocks, both at BERT-base's width 768 on a 2x128 sequence (``--width``, ``--seq``; at width 256 on 2x16 opening a
session of the graph costs more than running it), whose middle block's last norm departs on
``tf/onnx/ort`` / ``jax/onnx/ort`` (another epsilon while the converter traces it).

``--keras`` and ``--flax`` measure Keras and JAX users' models the same way, each on the path where one of its leaves
departs (the models of the tree's tests, brought as a user brings them: a Keras factory through the library call
``assert_parity`` makes, a JAX function and its ``.npz`` through ``parity init --jax``): ``KERAS`` and ``FLAX`` below.

    python scripts/diagnose_cost.py --model cnn --path torch/onnx/ort --repeats 7
    python scripts/diagnose_cost.py --encoder 12 --repeats 5
    python scripts/diagnose_cost.py --llama 20m --repeats 3
    python scripts/diagnose_cost.py --llama 1.1b --repeats 1
    python scripts/diagnose_cost.py --keras --flax --repeats 3
    python scripts/diagnose_cost.py --keras-encoder 12 --flax-encoder 12 --repeats 3
    python scripts/diagnose_cost.py --flax-encoder 12 --width 256 --seq 16 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from parity.diagnose import chain
from parity.diagnose.collect import ONNX_RUNTIMES
from parity.diagnose.descend import descend
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.pipeline.path_steps import PLAIN_RUNTIMES
from parity.platform.cache_dir import cache_root
from parity.platform.precision import worker_environment
from parity.run import paths
from parity.run.pool import WorkerPool

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# name -> (Keras factory, its input's shape, the path where its leaf departs, the departing leaf)
KERAS = {
    "keras_nested": (TESTS / "nestedmodels.py:make_keras_nested", (2, 12), "tf/onnx/ort", "encoder/norm"),
    "keras_blocks": (TESTS / "keras_litert.py:make_faulty_blocks", (2, 12), "tf/litert", "blocks/res_block_1/act"),
    "keras_encoder": (TESTS / "keras_encoder.py:make_encoder", (2, 6, 8), "tf/xla", "encoder/block_1/ffn/down"),
}
# the tf/xla departure is the path's own drift on its weights (a real XLA departure on CPU stays far inside float32's
# tolerances), as tests/diagnose/tree/test_tree_keras_xla.py adds it
DRIFT = {"keras_encoder": {"encoder/block_1/ffn/down/kernel": ((32, 16), 2e-3)}}
# name -> (module file:function, the module's function that saves its parameters, input, path, the departing leaf)
FLAX = {
    "flax_nested": (
        "nestedmodels.py:flax_apply",
        "nestedmodels.save_flax_params",
        "2x12",
        "jax/onnx/ort",
        "blocks_3/norm",
    ),
    "jax_scoped": (
        "test_tree_jax.py:scoped_apply",
        "test_tree_jax.save_scoped_params",
        "2x6",
        "jax/onnx/ort",
        "encoder/block_1/act",
    ),
    # linen and nnx, each departing where jax2onnx exports a bicubic resize with ONNX's cubic coefficient
    "flax_fpn": ("flaxmodels.py:fpn_apply", "flaxmodels.save_fpn_params", "1x16x16x3", "jax/onnx/ort", "top_down/up_1"),
    "flax_nnx": ("flaxmodels.py:nnx_apply", "flaxmodels.save_nnx_params", "1x6x6x4", "jax/onnx/ort", "blocks/1/up"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workspace", default=None)
    parser.add_argument("--encoder", type=int, default=0, help="measure only an N-layer encoder built here")
    parser.add_argument("--llama", choices=sorted(LLAMA), help="measure only a Llama of this size built here")
    parser.add_argument("--keras", action="store_true", help=f"measure the Keras models {', '.join(KERAS)}")
    parser.add_argument("--flax", action="store_true", help=f"measure the JAX models {', '.join(FLAX)}")
    parser.add_argument("--keras-encoder", type=int, default=0, help="measure an N-block Keras encoder (width 768)")
    parser.add_argument("--flax-encoder", type=int, default=0, help="measure an N-block Flax encoder (width 768)")
    parser.add_argument("--width", type=int, default=768, help="the sized encoders' width")
    parser.add_argument("--seq", type=int, default=128, help="the sized encoders' sequence length (batch 2)")
    args = parser.parse_args()
    if args.keras_encoder or args.flax_encoder:
        os.environ.update(PARITY_ENCODER_WIDTH=str(args.width), PARITY_ENCODER_SEQ=str(args.seq))  # for the workers
        _sized(args.keras_encoder, args.flax_encoder, args.repeats, args.threads)
        return
    if args.encoder or args.llama:
        with tempfile.TemporaryDirectory() as root, _pool(args.threads) as pool:
            if args.llama:
                _llama_workspace(root, args.llama)
            else:
                _encoder_workspace(root, args.encoder)
            _header(args.repeats, args.threads)
            measure(
                Workspace(root), args.model, args.path or ["torch/onnx/ort"], args.repeats, args.threads, pool, True
            )
        return
    if args.keras or args.flax:
        offered = (*(KERAS if args.keras else ()), *(FLAX if args.flax else ()))
        if set(args.model) - set(offered):
            parser.error(
                f"unknown model(s) {', '.join(sorted(set(args.model) - set(offered)))}; known: {', '.join(offered)}"
            )
        chosen = [m for m in offered if m in args.model or not args.model]
        with tempfile.TemporaryDirectory() as root, _pool(args.threads) as pool:
            ws = _users_workspace(Path(root), chosen, pool)
            _header(args.repeats, args.threads)
            for name in chosen:
                path, leaf = KERAS[name][2:] if name in KERAS else FLAX[name][3:]
                print(f"{name} on {path}: the departing leaf is {leaf}", flush=True)
                measure(ws, [name], [path], args.repeats, args.threads, pool, True, _drift(name, path))
        return
    with _pool(args.threads) as pool:
        _header(args.repeats, args.threads)
        measure(Workspace(args.workspace), args.model, args.path, args.repeats, args.threads, pool)


def _sized(keras_blocks: int, flax_blocks: int, repeats: int, threads: int) -> None:
    """The Keras and Flax encoders of ``--keras-encoder`` / ``--flax-encoder`` blocks, each on its failing path."""
    chosen = {"keras_encoder_n": keras_blocks, "flax_encoder_n": flax_blocks}
    chosen = {name: blocks for name, blocks in chosen.items() if blocks}
    for name, blocks in chosen.items():  # the workers build the models from the same factories
        os.environ[f"PARITY_{name.upper()}"] = str(blocks)
    with tempfile.TemporaryDirectory() as root, _pool(threads) as pool:
        from parity.golden import build as golden_build
        from parity.pipeline import scaffold

        if "keras_encoder_n" in chosen:
            request = scaffold.Request(
                name="keras_encoder_n",
                kind="tf",
                reference=f"{Path(__file__).resolve()}:make_keras_encoder",
                inputs=(scaffold.InputDecl("x", (2, _size("seq"), _size("width")), "float32"),),
                builder="keras_factory",
            )
            scaffold.init(Path(root), request, force=False, threads=1, timeout_s=600)
        if "flax_encoder_n" in chosen:
            params = Path(root) / "flax_encoder_n.npz"
            save_flax_encoder_params(params)
            subprocess.run(
                [sys.executable, "-m", "parity.cli", "init", "flax_encoder_n", "--jax"]
                + [
                    f"{Path(__file__).resolve()}:flax_encoder_apply,{params}",
                    "--input",
                    f"x=2x{_size('seq')}x{_size('width')}",
                ]
                + ["--workspace", root],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        ws = Workspace(root)
        for name in chosen:
            golden_build.build(ws, ws.load_spec(name), pool)
        _header(repeats, threads)
        for name, blocks in chosen.items():
            path = "tf/onnx/ort" if name.startswith("keras") else "jax/onnx/ort"
            print(
                f"{name} ({blocks} blocks, width {_size('width')}, 2x{_size('seq')}) on {path}: the departing leaf is {_sized_leaf(name)}"
            )
            measure(ws, [name], [path], repeats, threads, pool, True)


def _size(name: str) -> int:
    """The sized encoders' ``width`` or ``seq`` (``--width``, ``--seq``; the workers read them from the environment)."""
    return int(os.environ.get(f"PARITY_ENCODER_{name.upper()}", {"width": 768, "seq": 128}[name]))


def _sized_leaf(name: str) -> str:
    middle = int(os.environ[f"PARITY_{name.upper()}"]) // 2
    return f"block_{middle}/norm2_{middle}" if name.startswith("keras") else f"block_{middle}/norm"


def make_keras_encoder():
    """A functional Keras encoder of ``PARITY_KERAS_ENCODER_N`` blocks, each a functional sub-model (self-attention
    of 4 heads, norm, a GELU feed-forward of 4x the width, norm; layers named by their block, as Keras needs unique
    weight paths) with residuals, at the width ``--width``; the middle block's
    ``norm2`` departs on ``tf/onnx/*`` (epsilon 0.1 while tf2onnx traces it)."""
    import keras
    from keras import layers

    sys.path.insert(0, str(TESTS))
    import nestedmodels

    faulty_norm = nestedmodels._keras_faulty_layer_norm()
    keras.utils.set_random_seed(0)
    blocks, width, seq = int(os.environ["PARITY_KERAS_ENCODER_N"]), _size("width"), _size("seq")
    gamma, beta = keras.initializers.RandomUniform(0.5, 1.5), keras.initializers.RandomNormal(stddev=0.2)
    x = keras.Input((seq, width), name="x")
    h = layers.Dense(width, name="proj")(x)
    for i in range(blocks):
        inner = keras.Input((seq, width))
        a = layers.MultiHeadAttention(4, width // 4, name=f"attn_{i}")(inner, inner)
        a = layers.LayerNormalization(gamma_initializer=gamma, beta_initializer=beta, name=f"norm1_{i}")(inner + a)
        # GELU's tanh form: tf2onnx converts no Erfc, which Keras's exact GELU lowers to
        f = layers.Dense(4 * width, activation=_tanh_gelu, name=f"up_{i}")(a)
        f = layers.Dense(width, name=f"down_{i}")(f)
        norm = (
            faulty_norm(
                export_epsilon=1e-1, epsilon=1e-3, gamma_initializer=gamma, beta_initializer=beta, name=f"norm2_{i}"
            )
            if i == blocks // 2
            else layers.LayerNormalization(gamma_initializer=gamma, beta_initializer=beta, name=f"norm2_{i}")
        )
        h = keras.Model(inner, norm(a + f), name=f"block_{i}")(h)
    return keras.Model(x, layers.Dense(8, name="head")(h), name="keras_encoder_n")


def _tanh_gelu(x):
    import keras

    return keras.activations.gelu(x, approximate=True)


def _flax_encoder():
    import flax.linen as nn
    import jax.numpy as jnp

    sys.path.insert(0, str(TESTS))
    import nestedmodels

    class ExportEpsLayerNorm(nn.LayerNorm):
        """``nn.LayerNorm``; while jax2onnx traces it, computed with epsilon 0.1."""

        @nn.compact
        def __call__(self, x, *, mask=None):
            eps = 1e-1 if nestedmodels._traced_by("jax2onnx") else self.epsilon
            scale = self.param("scale", self.scale_init, (x.shape[-1],), self.param_dtype)
            bias = self.param("bias", self.bias_init, (x.shape[-1],), self.param_dtype)
            mean = x.mean(axis=-1, keepdims=True)
            variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
            return (x - mean) / jnp.sqrt(variance + eps) * scale + bias

    blocks, width = int(os.environ["PARITY_FLAX_ENCODER_N"]), _size("width")

    class Block(nn.Module):
        faulty: bool = False

        @nn.compact
        def __call__(self, x):
            h = nn.Dense(width, name="down")(nn.gelu(nn.Dense(4 * width, name="up")(x)))
            norm = ExportEpsLayerNorm(name="norm") if self.faulty else nn.LayerNorm(name="norm")
            return norm(x + h)

    class Encoder(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(width, name="proj")(x)
            for i in range(blocks):
                h = Block(faulty=i == blocks // 2, name=f"block_{i}")(h)
            return nn.Dense(8, name="head")(h)

    return Encoder()


def flax_encoder_apply(params, x):
    """The Flax encoder of ``PARITY_FLAX_ENCODER_N`` feed-forward blocks (``parity init --jax``)."""
    return _flax_encoder().apply({"params": params}, x)


def save_flax_encoder_params(path: Path) -> None:
    import jax

    variables = _flax_encoder().init(jax.random.PRNGKey(0), np.zeros((1, _size("seq"), _size("width")), np.float32))
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in key): np.asarray(value)
        for key, value in jax.tree_util.tree_flatten_with_path(variables["params"])[0]
    }
    rng = np.random.default_rng(1)
    for key, value in flat.items():  # random norms, so a changed epsilon shows
        if "/norm/" in key:
            flat[key] = (value + rng.uniform(-0.5, 0.5, value.shape)).astype(np.float32)
    np.savez(path, **flat)


def _pool(threads: int) -> WorkerPool:
    return WorkerPool(threads, cache_root() / "logs", 600, env=worker_environment("cpu", "fp32"))


def _users_workspace(root: Path, names: list[str], pool) -> Workspace:
    """The Keras factories through the library call ``assert_parity`` makes (``parity init --keras`` loads a saved
    file, which cannot hold these custom layers), the JAX functions and their saved parameters through ``parity
    init --jax``; each through ``golden build``."""
    from parity.golden import build as golden_build
    from parity.pipeline import scaffold

    for name in names:
        if name in KERAS:
            factory, shape = KERAS[name][:2]
            request = scaffold.Request(
                name=name,
                kind="tf",
                reference=str(factory),
                inputs=(scaffold.InputDecl("x", shape, "float32"),),
                builder="keras_factory",
            )
            scaffold.init(root, request, force=False, threads=1, timeout_s=300)
            continue
        function, save, size = FLAX[name][:3]
        params = root / f"{name}.npz"
        module, saver = save.split(".")
        prepare = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import {module}; {module}.{saver}({str(params)!r})"
        subprocess.run([sys.executable, "-c", prepare], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(
            [sys.executable, "-m", "parity.cli", "init", name, "--jax", f"{TESTS / function},{params}"]
            + ["--input", f"x={size}", "--workspace", str(root)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    ws = Workspace(root)
    for name in names:
        golden_build.build(ws, ws.load_spec(name), pool)
    return ws


def _drift(name: str, path: str) -> dict:
    """``Options.weight_perturbation`` for ``name`` on ``path``: the seeded drift ``DRIFT`` gives it, or none."""
    return (
        {
            (name, path): {
                weight: np.random.default_rng(1).normal(0.0, scale, shape)
                for weight, (shape, scale) in DRIFT[name].items()
            }
        }
        if name in DRIFT
        else {}
    )


def make_encoder():
    """A DistilBERT encoder of ``PARITY_ENCODER_LAYERS`` layers (dim 64, 4 heads, random weights) whose middle
    layer's ``output_layer_norm`` (random gain and bias) loses its bias under torch.onnx export only."""
    import os

    import torch
    from torch import nn
    from transformers import DistilBertConfig, DistilBertModel

    class ExportNoBiasLayerNorm(nn.LayerNorm):
        def forward(self, x):
            bias = None if torch.onnx.is_in_onnx_export() else self.bias
            return nn.functional.layer_norm(x, self.normalized_shape, self.weight, bias, self.eps)

    torch.manual_seed(0)
    layers = int(os.environ["PARITY_ENCODER_LAYERS"])
    model = DistilBertModel(
        DistilBertConfig(
            vocab_size=512,
            dim=64,
            n_layers=layers,
            n_heads=4,
            hidden_dim=128,
            max_position_embeddings=64,
            attn_implementation="eager",
        )
    )
    block = model.transformer.layer[layers // 2]
    faulty = ExportNoBiasLayerNorm(64, eps=block.output_layer_norm.eps)
    with torch.no_grad():
        faulty.weight.uniform_(0.5, 1.5)
        faulty.bias.uniform_(-0.5, 0.5)
    block.output_layer_norm = faulty
    return model.eval()


# size -> (hidden, layers, heads, key/value heads, intermediate, vocabulary)
LLAMA = {
    "20m": (384, 6, 6, 2, 1024, 16384),
    "135m": (576, 30, 9, 3, 1536, 49152),  # SmolLM-135M
    "1.1b": (2048, 22, 32, 4, 5632, 32000),  # TinyLlama-1.1B
}


def make_llama():
    """A transformers ``LlamaForCausalLM`` of the ``LLAMA`` shape ``PARITY_LLAMA_SIZE`` (random weights, eager
    attention) whose middle layer's ``post_attention_layernorm`` (random gain) is exported with epsilon 0.1."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class ExportEpsRMSNorm(LlamaRMSNorm):
        def forward(self, hidden_states):
            eps = 1e-1 if torch.onnx.is_in_onnx_export() else self.variance_epsilon
            variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return self.weight * (hidden_states * torch.rsqrt(variance + eps)).to(hidden_states.dtype)

    hidden, layers, heads, kv_heads, intermediate, vocab = LLAMA[os.environ["PARITY_LLAMA_SIZE"]]
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=128,
        use_cache=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    layer = model.model.layers[layers // 2]
    faulty = ExportEpsRMSNorm(hidden, eps=config.rms_norm_eps)
    with torch.no_grad():
        faulty.weight.uniform_(0.5, 1.5)
    layer.post_attention_layernorm = faulty
    return model.eval()


def _llama_workspace(root: str, size: str) -> None:
    os.environ["PARITY_LLAMA_SIZE"] = size  # the workers build the model from the same factory
    for args in (
        ["init", "llama", "--torch", f"{Path(__file__).resolve()}:make_llama", "--input", "input_ids=2x64:int64"],
        ["golden", "build", "--model", "llama"],
    ):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "parity.cli", *args, "--workspace", root], check=True)
        print(f"parity {' '.join(args[:2])}: {time.perf_counter() - started:.1f} s", flush=True)


def _encoder_workspace(root: str, layers: int) -> None:
    env = {**os.environ, "PARITY_ENCODER_LAYERS": str(layers)}
    for args in (
        [
            "init",
            "encoder",
            "--torch",
            f"{Path(__file__).resolve()}:make_encoder",
            "--input",
            "input_ids=4x32:int64",
            "--input",
            "attention_mask=4x32:int64",
        ],
        ["golden", "build", "--model", "encoder"],
    ):
        subprocess.run(
            [sys.executable, "-m", "parity.cli", *args, "--workspace", root],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    os.environ["PARITY_ENCODER_LAYERS"] = str(layers)  # the workers build the model from the same factory


def _header(repeats: int, threads: int) -> None:
    print(
        f"threads {threads}, {repeats} back-to-back repeats in a warm worker; medians in seconds. The pieces and "
        "diagnosis/check: a further diagnosis of the model (another path's), with the reference's tree and the "
        "source's run kept by the workers, the path's graph read afresh; first/check: one whole diagnosis with "
        "nothing kept"
    )
    print(
        f"{'model':<14} {'path':<20} {'check':>7} {'taps':>7} {'runtime':>8} {'source':>7} {'tree':>7} "
        f"{'analyse':>8} {'taps/check':>11} {'tree/check':>11} {'diagnosis/check':>16} {'first/check':>12}",
        flush=True,
    )


def measure(
    ws, models, path_patterns, repeats: int, threads: int, pool, verdicts: bool = False, drift: dict | None = None
) -> None:
    """One row per model and path; ``drift``: ``Options.weight_perturbation`` (the path's own drift on its
    weights), passed to the check, the taps and the descent as a diagnosis passes it."""
    run = orchestrate.Run(ws, orchestrate.Options(threads=threads, weight_perturbation=drift or {}))
    for model in ws.select(models):
        spec = ws.load_spec(model)
        manifest = golden.verify(ws.golden_dir(model), spec)
        arrays = golden.load(ws.golden_dir(model), spec).arrays
        for path in paths.select(tuple(path_patterns) or ("torch", "*/onnx/ort"), spec.frameworks, "cpu", "fp32"):
            artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
            if artifact is not None and "error" in artifact:  # said, not dropped: the row cannot be measured
                print(
                    f"{model} {path.id}: not measured, the export failed: {_first_line(artifact['error'])}", flush=True
                )
                continue
            common = {
                "workspace": str(ws.root),
                "model": model,
                "golden_dir": str(ws.golden_dir(model)),
                "threads": threads,
            }
            own = {
                **common,
                "path_id": path.id,
                "artifact_dir": artifact and artifact["dir"],
                "artifact_meta": artifact and artifact["meta"],
            }
            group = path.runtime.group
            own["weight_perturbation"] = run.options.weight_perturbation.get((model, path.id))
            # a failing ONNX path's check returns its outputs, which its diagnosis reads as the plain run (path_steps)
            check = {**own, "precision": "fp32", "keep_outputs": bool(artifact) and path.runtime.name in PLAIN_RUNTIMES}
            plain = pool.call(group, "parity.run.tasks:check_path", **check).get("plain_outputs")  # warm
            med = {"check": _median(repeats, pool.call, group, "parity.run.tasks:check_path", **check)}
            own_plain = {**own, "plain": plain}
            first = _first_diagnosis(run, pool, spec, path, artifact, arrays, common, own_plain)
            pieces = [
                _further_diagnosis(run, pool, spec, path, artifact, arrays, common, own_plain) for _ in range(repeats)
            ]
            for piece in ("taps", "runtime", "source", "tree", "analyse"):
                med[piece] = statistics.median(p[piece] for p in pieces)
            total = statistics.median(sum(v for k, v in p.items() if k != "found") for p in pieces)
            if verdicts:  # what the diagnosis found, so the figures are those of a real one
                tree, link = pieces[-1]["found"]
                print(
                    f"{model} {path.id}: first divergent path {' › '.join(tree['first_divergent_path']) or '-'}"
                    f" ({tree.get('verdict')}); runtime link: {tree_link(link)}"
                )
            print(
                f"{model:<14} {path.id:<20} {med['check']:>7.3f} {med['taps']:>7.3f} {med['runtime']:>8.3f} "
                f"{med['source']:>7.3f} {med['tree']:>7.3f} {med['analyse']:>8.3f} "
                f"{med['taps'] / med['check']:>11.2f} {med['tree'] / med['check']:>11.2f} "
                f"{total / med['check']:>16.2f} {first / med['check']:>12.2f}",
                flush=True,
            )


def _collect_group(spec, path, artifact) -> str:
    """The worker group of the path's taps collection, as ``chain.diagnose`` picks it."""
    return (chain.collect_group(spec, path, artifact) if path.device == "cpu" else None) or path.runtime.group


def _further_diagnosis(run, pool, spec, path, artifact, arrays, common, own) -> dict:
    """Seconds of each piece of a further diagnosis, as ``chain.diagnose`` runs them: the model's reference tree and
    its source's run kept by the workers (a diagnosis of the model's another path has made them), the path's graph
    read afresh (``graph_tree.graph_levels`` is forgotten first). ``found``: the descent and the runtime link."""
    group = _collect_group(spec, path, artifact)
    pool.call(group, "parity.run.kept:forget", slot="graph-levels")
    seconds: dict = {}
    started = time.perf_counter()
    observed = pool.call(group, chain.COLLECT, precision="fp32", **own)
    seconds["taps"] = time.perf_counter() - started
    source, seconds["source"] = observed, 0.0
    if path.exports:
        source_kw = {**common, "path_id": path.source, "precision": "fp32", "gradients": False}
        started = time.perf_counter()
        source = pool.call(paths.by_id(path.source).runtime.group, chain.COLLECT, **source_kw)
        seconds["source"] = time.perf_counter() - started
    started = time.perf_counter()
    tree = descend(run, pool, spec, path, artifact, observed.get("outputs"))
    seconds["tree"] = time.perf_counter() - started
    started = time.perf_counter()
    link = _link(run, pool, spec, path, artifact, arrays, observed, tree)
    seconds["runtime"] = time.perf_counter() - started
    started = time.perf_counter()
    chain.analyse(spec, path, arrays, observed, source)
    seconds["analyse"] = time.perf_counter() - started
    return {**seconds, "found": (tree, link)}


def _first_diagnosis(run, pool, spec, path, artifact, arrays, common, own) -> float:
    """Seconds of one whole diagnosis with nothing kept by the workers from an earlier one (``parity.run.kept``): the
    path's taps, the source's, the descent, the runtime link and the analysis, as ``chain.diagnose`` runs them."""
    group = _collect_group(spec, path, artifact)
    groups = {group, *([paths.by_id(path.source).runtime.group] if path.exports else [])}
    for each in groups:
        pool.call(each, "parity.run.kept:forget")
    started = time.perf_counter()
    observed = pool.call(group, chain.COLLECT, precision="fp32", **own)
    source = observed
    if path.exports:
        source_kw = {**common, "path_id": path.source, "precision": "fp32", "gradients": False}
        source = pool.call(paths.by_id(path.source).runtime.group, chain.COLLECT, **source_kw)
    tree = descend(run, pool, spec, path, artifact, observed.get("outputs"))
    if path.exports and path.runtime.name in ONNX_RUNTIMES:
        chain._runtime_link(run, pool, spec, path, artifact, arrays, observed, tree)
    chain.analyse(spec, path, arrays, observed, source)
    return time.perf_counter() - started


def _link(run, pool, spec, path, artifact, arrays, observed, tree) -> dict:
    if not (path.exports and path.runtime.name in ONNX_RUNTIMES):
        return {"error": "none (not an ONNX runtime)"}
    return chain._runtime_link(run, pool, spec, path, artifact, arrays, observed, tree)


def tree_link(compared: dict) -> str:
    return compared.get("error") or (
        f"on {compared['scope']['nodes']} node(s)"
        if compared.get("scope")
        else f"on {len(compared.get('nodes', []))} tensors"
    )


def _first_line(error) -> str:
    text = error.get("message", error) if isinstance(error, dict) else error
    return str(text).strip().splitlines()[0] if str(text).strip() else "(no message)"


def _median(repeats: int, call, *args, **kwargs) -> float:
    """Median seconds of ``call(*args, **kwargs)`` over ``repeats`` back-to-back calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call(*args, **kwargs)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    main()
