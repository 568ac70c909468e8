"""Measure the memory factors of ``parity.run.estimate``: each step's peak RSS over its process's baseline, in units
of the model's float32 weights, on a small transformers Llama of random weights (inputs of 2 x 64 tokens).

Each step runs in a fresh process (its peak is the kernel's ``ru_maxrss``); the baseline is the process's RSS once
its frameworks are imported, before the model exists. The steps are named as ``parity.run.estimate.COSTS`` names
them: ``load`` (the model built in float32 and run), ``reference`` (a float64 copy of the whole model beside it),
``export`` (torch.onnx, dynamo), ``ort`` (an ONNX Runtime session of the export, over the .onnx file's size) and
``onnxref`` (the export under ``onnx.reference``). Prints one line per step: weights, peak over baseline, the
factor, and seconds per GB of weights; ``--record FILE`` also writes the run into ``FILE`` (``memory_factors.json``
beside this script, which the repository keeps and ``tests/run/test_memory.py`` holds the table to), replacing an
earlier run of the same model.

    python scripts/memory_factors.py [--hidden 512 --layers 8] [--record scripts/memory_factors.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = ("load", "reference", "export", "ort", "onnxref")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _model(hidden: int, layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 256, 1),
        max_position_embeddings=256,
        use_cache=False,
    )
    return LlamaForCausalLM(config).eval()


def step(name: str, hidden: int, layers: int, folder: str) -> dict:
    """One step in this process: ``{"weights", "baseline", "peak", "seconds"}`` in bytes and seconds."""
    onnx_file = os.path.join(folder, "model.onnx")
    if name == "onnxref":
        import numpy as np
        import onnx
        from onnx.reference import ReferenceEvaluator

        baseline = _rss()
        started = time.perf_counter()
        evaluator = ReferenceEvaluator(onnx.load(onnx_file))
        evaluator.run(None, {evaluator.input_names[0]: np.zeros((2, 64), dtype=np.int64)})
        weights = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        return {"weights": weights, "baseline": baseline, "peak": _peak(), "seconds": time.perf_counter() - started}
    if name == "ort":
        import numpy as np
        import onnxruntime

        baseline = _rss()
        started = time.perf_counter()
        session = onnxruntime.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: np.zeros((2, 64), dtype=np.int64)}
        session.run(None, feed)
        weights = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        return {"weights": weights, "baseline": baseline, "peak": _peak(), "seconds": time.perf_counter() - started}
    import copy

    import torch
    import transformers  # noqa: F401 - imported before the baseline

    baseline = _rss()
    started = time.perf_counter()
    model = _model(hidden, layers)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    ids = torch.zeros((2, 64), dtype=torch.int64)
    with torch.no_grad():
        if name == "load":
            model(ids)
        elif name == "reference":  # today's reference: a float64 copy of the whole model beside the float32 one
            copy.deepcopy(model).double()(ids)
        elif name == "export":
            started = time.perf_counter()
            torch.onnx.export(model, (ids,), onnx_file, dynamo=True, external_data=True)
    return {"weights": weights, "baseline": baseline, "peak": _peak(), "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--record", type=Path, help="write the run into this JSON file (memory_factors.json)")
    parser.add_argument("--step")
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.step:
        print(json.dumps(step(args.step, args.hidden, args.layers, args.folder)))
        return
    measured = []
    with tempfile.TemporaryDirectory() as folder:
        for name in STEPS:
            command = [sys.executable, __file__, "--step", name, "--folder", folder]
            command += ["--hidden", str(args.hidden), "--layers", str(args.layers)]
            out = json.loads(
                subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            over = out["peak"] - out["baseline"]
            factor, per_gb = over / out["weights"], out["seconds"] / (out["weights"] / 1e9)
            measured.append(
                {
                    "step": name,
                    "weights_bytes": out["weights"],
                    "factor": round(factor, 2),
                    "seconds_per_gb": round(per_gb, 1),
                }
            )
            print(
                f"{name:9s} weights {out['weights'] / 1e6:8.1f} MB  peak over baseline {over / 1e6:8.1f} MB  "
                f"factor {factor:5.2f}  {per_gb:7.1f} s/GB",
                flush=True,
            )
    if args.record:
        _record(args.record, f"transformers Llama, hidden {args.hidden}, {args.layers} layers, 2 x 64 tokens", measured)


def _record(path: Path, model: str, steps: list[dict]) -> None:
    """``steps`` (one ``{"step", "factor", ...}`` each) as the run of ``model`` in the JSON file ``path`` (``{"runs": [...]}``), in place of an earlier one."""
    import platform

    import onnx
    import onnxruntime
    import onnxscript
    import torch

    from parity.platform.safefs import write_json_atomic

    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    run = {
        "model": model,
        "source": "scripts/memory_factors.py: peak RSS over the process's baseline, one fresh process per step",
        "machine": f"{os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 1e9:.0f} GB",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "onnxscript": onnxscript.__version__,
            "onnxruntime": onnxruntime.__version__,
            "onnx": onnx.__version__,
        },
        "steps": steps,
    }
    write_json_atomic(path, {"runs": [r for r in runs if r["model"] != model] + [run]})


if __name__ == "__main__":
    main()
