"""Measure the float64 reference of a transformers Llama of random weights, cast whole, streamed module by module
(``parity.sources.torch_streamed``) from the model in memory, and streamed from its safetensors files memory-mapped
(``parity.model.weight_files``): peak RSS, peak anonymous memory, seconds, and whether all give the same logits.

Each mode runs in a fresh process (its peak is the kernel's ``ru_maxrss``; the baseline is the process's RSS once
torch and transformers are imported, before the model exists; anonymous memory, what cannot be dropped for the files'
pages, is sampled from ``/proc/self/status`` every 10 ms), on inputs of 2 x 64 tokens. The files are written (float32,
``save_pretrained``) by a process of their own first. The default shape is SmolLM-135M's (hidden 576, 30 layers,
vocabulary 49152, tied embeddings): 135M parameters.

    python scripts/streamed_reference.py [--hidden 576 --layers 30 --vocab 49152]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("whole", "streamed", "files")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _anonymous() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def _watch_anonymous(peak: list) -> None:
    """Keep ``peak[0]`` the largest anonymous RSS of this process, sampled every 10 ms (a daemon thread)."""

    def sample():
        while True:
            peak[0] = max(peak[0], _anonymous())
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()


def _model(args, folder: str | None = None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=9 if args.hidden % 9 == 0 else 8,
        num_key_value_heads=3 if args.hidden % 9 == 0 else 4,
        tie_word_embeddings=True,
    )
    if folder is not None:  # the architecture, its weights mapped from the files
        from parity.model import weight_files

        return weight_files.build(torch, lambda: LlamaForCausalLM(config).eval(), Path(folder), keep_dtypes=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def child(args) -> None:
    """One mode in this process: build the float32 model, compute the float64 logits, report peak and time."""
    import numpy as np
    import torch
    import transformers  # noqa: F401 - imported before the baseline

    from parity.model.size import torch_weight_bytes
    from parity.sources import torch_streamed
    from parity.sources.torch import hold_in

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.mode == "save":
        _model(args).save_pretrained(args.out)
        return
    baseline, anonymous = _rss(), [0]
    _watch_anonymous(anonymous)
    model = _model(args, args.files if args.mode == "files" else None)
    weights = torch_weight_bytes(model)
    ids = torch.randint(0, args.vocab, (2, 64), generator=torch.Generator().manual_seed(1))
    started = time.perf_counter()
    streamer = None
    with torch.inference_mode():
        if args.mode == "whole":  # as the torch source holds a reference cast whole
            model = hold_in(torch, model, torch.float64)
            logits = model(input_ids=ids).logits
        else:
            streamer = torch_streamed.Streamer(torch, model)
            logits = streamer.run(lambda: model(input_ids=ids).logits)
    seconds = time.perf_counter() - started
    np.save(args.out, logits.numpy())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "mode": args.mode,
                "parameters": sum(p.numel() for p in model.parameters()),
                "weights": weights,
                "baseline": baseline,
                "peak": peak,
                "anonymous": anonymous[0],
                "seconds": seconds,
                "units": len(streamer.units) if streamer else 1,
                "float64_held": streamer.stats.peak_bytes if streamer else 2 * weights,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--mode", choices=(*MODES, "save"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        child(args)
        return
    import numpy as np

    rows, logits = [], {}
    with tempfile.TemporaryDirectory() as folder:
        files = os.path.join(folder, "weights")
        shape = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab)]
        for mode in ("save", *MODES):
            out = files if mode == "save" else os.path.join(folder, f"{mode}.npy")
            done = subprocess.run(
                [sys.executable, "-m", "scripts.streamed_reference", *shape, "--mode", mode, "--out", out]
                + ["--files", files],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if done.returncode:
                sys.exit(f"the {mode} step failed (exit code {done.returncode}):\n{done.stderr[-2000:]}")
            if mode != "save":
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                logits[mode] = np.load(out)
    gb = 1e9
    print(
        f"Llama of {rows[0]['parameters'] / 1e6:.0f}M parameters, {rows[0]['weights'] / gb:.2f} GB of float32 weights"
    )
    print("| reference | peak RSS | over baseline | peak anonymous | float64 held at once | units | seconds |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['mode']} | {row['peak'] / gb:.2f} GB | {(row['peak'] - row['baseline']) / gb:.2f} GB "
            f"| {row['anonymous'] / gb:.2f} GB | {row['float64_held'] / gb:.3f} GB | {row['units']} "
            f"| {row['seconds']:.1f} |"
        )
    for mode in MODES[1:]:
        difference = np.abs(logits["whole"] - logits[mode]).max()
        print(
            f"{mode}: logits bitwise the whole model's: {np.array_equal(logits['whole'], logits[mode])} ({difference:.3g})"
        )


if __name__ == "__main__":
    main()
