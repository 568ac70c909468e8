#!/usr/bin/env python
"""Nested models with one faulty leaf through the README's commands: where does the diagnosis end?

Each model of ``tests/nestedmodels.py``, ``keras_litert.py``, ``keras_encoder.py`` and ``flaxmodels.py`` (torch,
Keras and Flax models with one leaf that computes something else on a path, or none) goes through the command line
as a user's would, in a fresh workspace: ``parity init`` -> ``golden build`` -> ``check``, then for
every failing path ``diagnose --json`` and ``repro``. One row per model and failing path: the verdict, the faulty
leaf the model was built with, the first divergent tap, the first divergent path (a descent into the module tree,
where the diagnosis gives one), the tested cause and the node count of the reduced repro. A key the diagnosis does
not give is '-'.

    python scripts/nested_models.py [--models residual_stack,cnn_stages] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = [ROOT / "tests" / f for f in ("nestedmodels.py", "keras_litert.py", "keras_encoder.py", "flaxmodels.py")]
IDS = ["--input", "input_ids=2,sequence:int64", "--input", "attention_mask=2,sequence:int64"]

MODELS = {  # name -> (init's source option, its reference, --input/--axis arguments, the faulty leaf)
    "residual_stack": ("--torch", "nestedmodels.py:make_residual_stack", ["--input", "x=2x16"], "blocks.5.norm"),
    "cnn_stages": ("--torch", "nestedmodels.py:make_cnn_stages", ["--input", "x=2x3x16x16"], "features.1.3"),
    "distilbert": (
        "--torch",
        "nestedmodels.py:make_faulty_distilbert",
        [*IDS, "--axis", "sequence=16"],
        "transformer.layer.1.output_layer_norm",
    ),
    "vit": (
        "--torch",
        "nestedmodels.py:make_faulty_vit",
        ["--input", "pixel_values=2x3x16x16"],
        "layers.2.layernorm_before",
    ),
    "bert": (
        "--torch",
        "nestedmodels.py:make_faulty_bert",
        [*IDS, "--input", "token_type_ids=2,sequence:int64:2", "--axis", "sequence=16"],
        "encoder.layer.1.intermediate.intermediate_act_fn",
    ),
    "gpt2": ("--torch", "nestedmodels.py:make_faulty_gpt2", [*IDS, "--axis", "sequence=16"], "h.1.mlp.act"),
    "keras_nested": ("--keras", "keras_nested.keras", ["--input", "x=2x12"], "encoder/norm"),
    "flax_nested": ("--jax", "nestedmodels.py:flax_apply,flax_nested.npz", ["--input", "x=2x12"], "blocks_3/norm"),
    # a Sequential of custom residual layers; its GELU computes the tanh form while the TFLite converter traces it
    "keras_blocks": ("--keras", "keras_litert.py:make_faulty_blocks", ["--input", "x=2x12"], "blocks/res_block_1/act"),
    # a hand-written encoder (custom blocks holding attention, norms, a feed-forward): every path should pass
    "keras_encoder": ("--keras", "keras_encoder.py:make_encoder", ["--input", "x=2x6x8"], "-"),
    # a flax.linen FPN and a flax.nnx model: jax2onnx's cubic resize departs from JAX's (a real converter divergence)
    "flax_fpn": ("--jax", "flaxmodels.py:fpn_apply,fpn.npz", ["--input", "x=1x16x16x3"], "top_down/up_1"),
    "flax_nnx": ("--jax", "flaxmodels.py:nnx_apply,nnx.npz", ["--input", "x=1x6x6x4"], "blocks/1/up"),
}
PREPARE = {
    "keras_nested": "import nestedmodels; nestedmodels.save_keras_nested('keras_nested.keras')",
    "flax_nested": "import nestedmodels; nestedmodels.save_flax_params('flax_nested.npz')",
    "flax_fpn": "import flaxmodels; flaxmodels.save_fpn_params('fpn.npz')",
    "flax_nnx": "import flaxmodels; flaxmodels.save_nnx_params('nnx.npz')",
}


def parity(root: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "parity.cli", *args, "--workspace", str(root)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def init_keras_factory(root: Path, name: str, reference: str, inputs: list[str]) -> None:
    """``parity init --keras`` loads a ``.keras`` file without importing the module that registers its custom layer,
    and a factory is not a file: the spec is written by the library call ``assert_parity`` uses, with the factory as
    the model's builder."""
    from parity.pipeline import scaffold

    declared = []
    for text in inputs[1::2]:
        input_name, _, shape = text.partition("=")
        declared.append(scaffold.InputDecl(input_name, tuple(int(d) for d in shape.split("x")), "float32"))
    request = scaffold.Request(
        name=name,
        kind="tf",
        reference=reference if ".py:" in reference else "nestedmodels.py:make_keras_nested",
        inputs=tuple(declared),
        builder="keras_factory",
    )
    scaffold.init(root, request, force=True, threads=2, timeout_s=300)


def one(name: str, root: Path) -> list[dict]:
    """One model through the commands in ``root``: a row per failing path (or one row saying where it stopped)."""
    flag, reference, inputs, leaf = MODELS[name]
    for factory in FACTORIES:
        shutil.copy(factory, root / factory.name)
    base = {"model": name, "leaf": leaf}
    if name in PREPARE:
        done = subprocess.run(
            [sys.executable, "-c", PREPARE[name]], cwd=root, capture_output=True, text=True, check=False
        )
        if done.returncode:
            return [{**base, "verdict": "prepare: " + (done.stderr.strip().splitlines() or ["failed"])[-1][:150]}]
    code, text = parity(root, "init", name, flag, reference, *inputs)
    if code and flag == "--keras":
        base["note"] = "init --keras cannot load the custom layer: spec written with keras_factory"
        init_keras_factory(root, name, reference, inputs)
    elif code:
        return [{**base, "verdict": f"init: {text.splitlines()[-1][:150]}"}]
    code, text = parity(root, "golden", "build", "--model", name)
    if code:
        return [{**base, "verdict": f"golden build: {text.splitlines()[-1][:150]}"}]
    parity(root, "check", "--model", name, "--json", str(root / "check.json"))
    if not (root / "check.json").exists():
        return [{**base, "verdict": "check wrote no JSON"}]
    rows = []
    for result in json.loads((root / "check.json").read_text())["results"]:
        if result["verdict"] == "pass":
            continue
        row = {**base, "path": result["path"], "verdict": result["verdict"]}
        out = root / f"diagnose-{len(rows)}.json"
        started = time.perf_counter()
        code, text = parity(root, "diagnose", "--model", name, "--path", result["path"], "--json", str(out))
        row["diagnose_s"] = time.perf_counter() - started
        found = json.loads(out.read_text())["results"] if out.exists() else []
        if not found:
            failed = f"{result['path']}: diagnose exit {code}: {(text.splitlines() or [''])[-1][:150]}"
            row["note"] = "; ".join(filter(None, (row.get("note"), failed)))
        diagnosis = (found[0].get("diagnosis") if found else None) or {}
        row["tap"] = diagnosis.get("first_divergent_tap") or "-"
        fdp = diagnosis.get("first_divergent_path")
        row["fdp"] = (fdp[-1] if isinstance(fdp, list) and fdp else fdp) or "-"
        cause = diagnosis.get("cause") or {}
        row["cause"] = f"{cause.get('tap', '?')}: {cause.get('variant', '?')}" if cause else "-"
        code, text = parity(
            root, "repro", "--model", name, "--path", result["path"], "--out", str(root / f"bug-{len(rows)}"), "--force"
        )
        nodes = re.search(r"\((\d+) nodes? -> (\d+)", text)
        row["repro"] = f"{nodes[1]}->{nodes[2]}" if nodes else f"exit {code}: {text.splitlines()[-1][:60]}"
        rows.append(row)
    return rows or [{**base, "verdict": "every path passes"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--keep", type=Path, help="keep the workspaces under this folder")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n] or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    columns = ("model", "path", "verdict", "leaf", "tap", "fdp", "cause", "repro", "diagnose_s")
    heads = (
        "model",
        "path",
        "verdict",
        "faulty leaf",
        "first tap",
        "first divergent path",
        "cause",
        "repro nodes",
        "diag s",
    )
    rows = []
    for name in names:
        root = Path(tempfile.mkdtemp(prefix=f"parity-nested-{name}-", dir=args.keep))
        started = time.perf_counter()
        try:
            rows += one(name, root)
        finally:
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    cells = [
        [(f"{row[c]:.1f}" if isinstance(row.get(c), float) else str(row.get(c, "-"))) for c in columns] for row in rows
    ]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    for note in dict.fromkeys(f"{row['model']}: {row['note']}" for row in rows if row.get("note")):
        print(note)


if __name__ == "__main__":
    main()
