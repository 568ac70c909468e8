"""``parity repro`` off ONNX: on a path that is no ONNX graph (tf/litert, tf/xla, jax), the leaf layer the diagnosis
names is written alone in the path's own format (a one-layer ``.tflite``, a SavedModel, a ``jax.export`` artifact)
with its float64 input and output and a ``repro.py`` that prints the error and exits 1 while it is over the tolerance.

The models are users' (``parity init --keras FILE:FUNCTION`` and ``--jax``): a Keras activation that computes the
tanh GELU while the TFLite converter traces it (departs on tf/litert only), a Keras layer that loses float32 digits to
cancellation (``Shift``: departs at float32 on every path, so it is no reproducer of LiteRT or XLA), a Flax LayerNorm
whose fast variance cancels on an input far from zero (jax), and a Flax embedding (token ids in): ``make_gelu`` and
``make_shift`` in tests/keras_litert.py, ``offset_apply``, ``embed_apply`` and ``nnx_apply`` in tests/flaxmodels.py.
"""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from tests import flaxmodels, keras_litert

LEAF = "blocks/block_1/act"
KERAS, FLAX = keras_litert.__file__, flaxmodels.__file__
# --------------------------------------------------------------------------- the workflow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The models, each through ``parity init`` and ``golden build`` when a test first asks for it."""
    root = tmp_path_factory.mktemp("repro_native")
    from tests.conftest import Models

    def jax_init(name: str, save, shape: str):
        """``--jax`` of ``FLAX:<name>_apply`` with the weights ``save`` writes when the model is first built."""
        return lambda: ["--jax", f"{FLAX}:{name}_apply,{save(root / f'{name}.npz')}", "--input", f"x={shape}"]

    inits = {
        "gelu": ["--keras", f"{KERAS}:make_gelu", "--input", "x=2x6"],
        "shift": ["--keras", f"{KERAS}:make_shift", "--input", "x=2x6"],
        "offset": jax_init("offset", partial(flaxmodels.save_offset_params, blocks=3, far=1), "2x6"),
        "embed": jax_init("embed", flaxmodels.save_embed_params, f"2x6:int32:{flaxmodels.VOCAB}"),
        "nnx": jax_init("nnx", flaxmodels.save_nnx_params, "x".join(map(str, flaxmodels.NNX_INPUT))),
    }
    return Models(root, inits)


@pytest.fixture(scope="module")
def workspace(models):
    """All the models built."""
    return models()


def _invoke(*args):
    from click.testing import CliRunner

    from parity.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _script(folder: Path):
    return subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=300)


def _fix(folder: Path, got) -> None:
    """The departure 'fixed': the expected output replaced by what the path computes."""
    np.save(folder / "expected.npy", np.asarray(got, np.float64))


@pytest.mark.slow
def test_jax_float32_fault_is_one_flax_module_exported_with_jax_export(workspace, tmp_path):
    out = tmp_path / "bug"
    result = _invoke("repro", "--model", "offset", "--path", "jax", "--out", out, "--workspace", workspace)
    assert result.exit_code == 0, result.output
    assert "reduced to one layer, blocks_1/norm (LayerNorm) in leaf.jax_exported" in result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "expected.npy",
        "input.npy",
        "leaf.jax_exported",
        "repro.py",
    ]
    x, want = np.load(out / "input.npy"), np.load(out / "expected.npy")
    assert x.dtype == want.dtype == np.float64 and x.shape == want.shape == (2, flaxmodels.WIDTH)
    assert np.abs(x.mean(axis=-1)).min() > flaxmodels.OFFSET / 2  # the input of the norm in the model, far from zero
    run = _script(out)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "jax.jit (StableHLO, float32): max abs error" in run.stdout and "over the path's tolerance" in run.stdout
    readme = (out / "README.md").read_text()
    assert "blocks_1 › norm" in readme and "flax.linen.normalization.LayerNorm" in readme
    assert "the same layer in float64" in readme and "parity repro --workspace" in readme

    import jax

    exported = jax.export.deserialize(bytearray((out / "leaf.jax_exported").read_bytes()))
    _fix(out, jax.jit(exported.call)(x.astype(np.float32)))
    assert _script(out).returncode == 0


def test_litert_converter_fault_is_a_one_layer_tflite_that_fails_until_fixed(models, tmp_path):
    pytest.importorskip("ai_edge_litert")
    workspace = models("gelu")
    out = tmp_path / "bug"
    result = _invoke("repro", "--model", "gelu", "--path", "tf/litert", "--out", out, "--workspace", workspace)
    assert result.exit_code == 0, result.output
    assert f"reduced to one layer, {LEAF} (ConverterGelu) in model.tflite" in result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "expected.npy",
        "input.npy",
        "model.tflite",
        "repro.py",
    ]
    x = np.load(out / "input.npy")
    assert x.dtype == np.float64 and x.shape == (2, keras_litert.REPRO_WIDTH)
    run = _script(out)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "LiteRT (model.tflite): max abs error" in run.stdout and "over the path's tolerance" in run.stdout
    readme = (out / "README.md").read_text()
    assert "blocks › block_1 › act" in readme and "ai-edge-litert" in readme
    assert "the same layer in Keras at float32 (TensorFlow's kernels)" in readme  # the converter, not float32

    from ai_edge_litert import interpreter as litert

    interpreter = litert.Interpreter(model_path=str(out / "model.tflite"))
    interpreter.allocate_tensors()
    assert [d["shape"].tolist() for d in interpreter.get_input_details()] == [[2, keras_litert.REPRO_WIDTH]]
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.astype(np.float32))
    interpreter.invoke()
    _fix(out, interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    assert _script(out).returncode == 0


def _native_repro(root: Path, pool, model: str, path_id: str, diagnosis: dict, out: Path, perturbation=None) -> dict:
    return pool.call(
        "jax" if path_id == "jax" else "tf",
        "parity.diagnose.repro_native:write",
        workspace=str(root),
        model=model,
        path_id=path_id,
        golden_dir=str(root / "golden" / model),
        precision="fp32",
        threads=1,
        diagnosis=diagnosis,
        out_dir=str(out),
        environment={},
        command="",
        weight_perturbation=perturbation,
    )


@pytest.mark.slow
def test_a_changed_weight_on_xla_is_float32s_own_and_written_for_tf(workspace, pool, tmp_path):
    """A weight changed on tf/xla only (the check's deliberate drift): the diagnosis descends to the Dense layer, but
    that layer alone departs with TensorFlow's own kernels as much as under XLA, so it is no reproducer of XLA and
    none is written for tf/xla; for the plain ``tf`` path it is one SavedModel whose script runs both modes."""
    from parity.diagnose import chain
    from parity.golden import store as golden
    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate
    from parity.run import paths

    delta = np.zeros((keras_litert.REPRO_WIDTH,) * 2, np.float32)
    delta[2, 3] = 0.5
    perturbation = {"blocks/block_2/dense/kernel": delta}
    ws = Workspace(workspace)
    spec = ws.load_spec("shift")
    assert "blocks/block_2/dense/kernel" in spec.params, sorted(spec.params)
    options = orchestrate.Options(threads=1, weight_perturbation={("shift", "tf/xla"): perturbation})
    run = orchestrate.Run(ws, options)
    d = chain.diagnose(run, pool, spec, golden.verify(ws.golden_dir("shift"), spec), paths.by_id("tf/xla"))
    assert d["first_divergent_path"][-1] == "blocks/block_2/dense", d["first_divergent_path"]
    out = tmp_path / "bug"
    outcome = _native_repro(workspace, pool, "shift", "tf/xla", d, out, perturbation)
    assert not outcome["written"] and "TensorFlow's kernels" in outcome["reason"], outcome
    assert "float32's own" in outcome["reason"] and not out.exists()
    outcome = _native_repro(workspace, pool, "shift", "tf", {**d, "path": "tf"}, out, perturbation)
    assert outcome["written"], outcome
    assert outcome["stats"]["path"]["tol_units"] > 1 >= outcome["stats"]["float64"]["tol_units"]
    assert (out / "saved_model" / "saved_model.pb").is_file()
    run = _script(out)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "TensorFlow's kernels (no XLA): max abs error" in run.stdout
    assert "XLA (tf.function(jit_compile=True)): max abs error" in run.stdout


@pytest.mark.slow
def test_a_float32_departure_is_not_blamed_on_litert(workspace, pool, tmp_path):
    """``Shift`` departs in Keras at float32 as much as on LiteRT: no LiteRT reproducer. A diagnosis whose drift
    enters at the definition (tf itself departs) is refused before anything is built."""
    pytest.importorskip("ai_edge_litert")
    out = tmp_path / "bug"
    leaf = {"tree": {"verdict": "leaf", "leaf": {"tap": LEAF}}}
    outcome = _native_repro(workspace, pool, "shift", "tf/litert", leaf, out)
    assert not outcome["written"] and "float32's own" in outcome["reason"], outcome
    assert "Keras at float32" in outcome["reason"] and not out.exists()
    outcome = _native_repro(workspace, pool, "gelu", "tf/litert", {**leaf, "links": {"enters_at": "definition"}}, out)
    assert not outcome["written"] and "entering at the definition" in outcome["reason"], outcome
    assert not out.exists()


@pytest.mark.slow
def test_an_integer_input_leaf_is_fed_its_own_dtype(workspace, pool, tmp_path):
    """A Flax ``Embed`` leaf (its table changed on jax only) reads token ids: they are kept as integers, in
    ``input.npy``, the exported module and the script."""
    out = tmp_path / "bug"
    perturbation = {"embed/embedding": np.full((flaxmodels.VOCAB, flaxmodels.WIDTH), 0.5, np.float32)}
    leaf = {"tree": {"verdict": "leaf", "leaf": {"tap": "embed"}}}
    outcome = _native_repro(workspace, pool, "embed", "jax", leaf, out, perturbation)
    assert outcome["written"], outcome
    x = np.load(out / "input.npy")
    assert x.dtype.kind == "i" and x.shape == (2, 6) and 0 <= x.min() and x.max() < flaxmodels.VOCAB
    assert np.load(out / "expected.npy").shape == (2, 6, flaxmodels.WIDTH)
    run = _script(out)
    assert run.returncode == 1 and "over the path's tolerance" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
def test_an_nnx_leaf_is_said_to_be_unsupported(workspace, pool, tmp_path):
    out = tmp_path / "bug"
    leaf = {"tree": {"verdict": "leaf", "leaf": {"tap": "blocks/0/norm"}}}
    outcome = _native_repro(workspace, pool, "nnx", "jax", leaf, out)
    assert not outcome["written"] and "flax.nnx" in outcome["reason"] and "linen" in outcome["reason"], outcome
    assert not out.exists()


def test_a_failure_on_the_eval_split_only_is_said_so():
    from parity.pipeline.repro_native import refusal
    from parity.run import paths

    said = refusal("m tf/litert", paths.by_id("tf/litert"), {"split": {"rows": [3, 1, 3]}})
    assert (
        said == "nothing to reduce on the fixed input set: m tf/litert fails on the eval split only (rows 1, 3); "
        "see its diagnosis"
    )


@pytest.mark.slow
def test_a_layer_that_does_not_fail_alone_writes_nothing_and_says_why(workspace, pool, tmp_path):
    """A diagnosis naming a healthy leaf (block_0's tanh) on tf/litert: the layer alone stays within the tolerance,
    so no reproducer is written and the reason says so; a diagnosis without a leaf is refused as before."""
    pytest.importorskip("ai_edge_litert")
    out = tmp_path / "bug"
    healthy = {"tree": {"verdict": "leaf", "leaf": {"tap": "blocks/block_0/act"}}}
    outcome = _native_repro(workspace, pool, "gelu", "tf/litert", healthy, out)
    assert not outcome["written"] and "stays within the tolerance" in outcome["reason"], outcome
    assert not out.exists()
    outcome = _native_repro(workspace, pool, "gelu", "tf/litert", {"tree": {"verdict": "own_operations"}}, out)
    assert not outcome["written"] and not out.exists()


def test_a_native_path_that_passes_is_nothing_to_reduce(models, tmp_path):
    workspace = models("gelu")
    result = _invoke("repro", "--model", "gelu", "--path", "tf", "--out", tmp_path / "a", "--workspace", workspace)
    assert result.exit_code == 0 and "nothing to reduce: gelu tf passes" in result.output
