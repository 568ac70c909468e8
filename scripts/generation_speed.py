"""Generation speed per path, side by side: torch, torch/onnx/ort, torch/onnx/openvino and torch/genai on a tiny
Llama and on a Llama of SmolLM-135M's shape (hidden 576, 30 layers, 9 heads, 3 key/value heads, intermediate 1536,
vocabulary 49152), random weights, timed by ``parity.generation.timing.time_path``.

    python scripts/generation_speed.py                            # both shapes, every path
    python scripts/generation_speed.py --shape 135m --batch 1 --batch 4 --budget 10 --threads 2
    python scripts/generation_speed.py --path torch --path torch/onnx/ort --json speed.json

Each export (ONNX, ONNX Runtime GenAI's builder) and each path's timing runs in a fresh process, so one path's
memory is not another's. Prints per shape and batch size the medians (with their 95 % intervals) of the time to
first token and of decode tokens per second, and each path's ratio to torch: ``ttft x`` = torch's time to first
token over the path's, ``decode x`` = the path's tokens per second over torch's (above 1: faster than torch).
These paths are timed here without being verified; ``parity check`` verifies them. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generation_matrix import SMOLLM_135M, build  # a sibling script: the same model builder

PATHS = ("torch", "torch/onnx/ort", "torch/onnx/openvino", "torch/genai")
SHAPES = {"tiny": None, "135m": SMOLLM_135M}


def _in_process(fn, **kwargs):
    """``fn(**kwargs)`` in a fresh process (spawned: no framework state inherited)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, **kwargs).result()


def prepare(shape: str, root: Path, paths: list[str]) -> dict:
    """The shape's folder (with a tokenizer), its ONNX export and its GenAI build, made once under ``root``:
    ``{"source", "onnx": (dir, meta), "genai": (dir, meta)}``."""
    from parity.generation import genai_decoder, onnx_export
    from parity.platform.safefs import write_json_atomic

    folder = root / shape / "model"
    if not (folder / "config.json").is_file():
        _in_process(build, model_type="llama", overrides={}, attn="sdpa", folder=folder, seed=7, base=SHAPES[shape])
    source = {"hf": str(folder)}
    made = {"source": source}
    steps = {"onnx": (onnx_export.export_task, "torch/onnx/"), "genai": (genai_decoder.export_task, "torch/genai")}
    for kind, (task, prefix) in steps.items():
        if not any(p.startswith(prefix) for p in paths):
            continue
        out, kept = root / shape / kind, root / shape / f"{kind}.meta.json"
        if not kept.is_file():
            print(f"{shape}: exporting ({kind})", flush=True)
            meta = _in_process(task, source=source, out_dir=str(out))
            write_json_atomic(kept, meta)  # written last: an export without it is made again
        made[kind] = (str(out), json.loads(kept.read_text()))
    return made


def time_paths(shape: str, made: dict, paths: list[str], args) -> dict:
    from parity.generation.timing import time_path

    rows = {}
    for path_id in paths:
        kind = "onnx" if path_id.startswith("torch/onnx/") else "genai" if path_id == "torch/genai" else None
        artifact_dir, meta = made.get(kind, (None, {})) if kind else (None, {})
        if kind and "unavailable" in meta:
            rows[path_id] = {"verdict": "skip", "reason": meta["unavailable"]}
            continue
        print(f"{shape}: timing {path_id}", flush=True)
        try:
            rows[path_id] = _in_process(
                time_path,
                source=made["source"],
                path_id=path_id,
                artifact_dir=artifact_dir,
                meta=meta,
                threads=args.threads,
                prompt_length=args.prompt_length,
                new_tokens=args.new_tokens,
                batch_sizes=args.batch,
                budget_s=args.budget,
                min_runs=args.min_runs,
            )
        except Exception as error:  # noqa: BLE001 - one path's failure is its row's, not the run's
            rows[path_id] = {"verdict": "error", "reason": f"{type(error).__name__}: {error}"}
    return rows


def _stat(stat: dict, digits: int) -> str:
    return f"{stat['median']:.{digits}f} [{stat['low']:.{digits}f}, {stat['high']:.{digits}f}]"


def table(shape: str, rows: dict, batches: list[int]) -> str:
    lines = [
        f"{shape}: time to first token (ms) and decode tokens/s, medians [95 % intervals]; x: ratio to torch",
        (
            f"{'path':20} {'batch':>5} {'ttft ms':>28} {'ttft x':>7} {'decode tok/s':>30} {'decode x':>8} "
            f"{'peak MiB':>9} {'cache MiB':>9} {'runs':>5}"
        ),
    ]
    base = rows.get("torch", {}).get("batches", {})
    for path_id, row in rows.items():
        if "batches" not in row:
            lines.append(f"{path_id:20} {row.get('verdict')}: {row.get('reason')}")
            continue
        for batch in map(str, batches):
            r, t = row["batches"][batch], base.get(batch)
            ttft_x = t["ttft_ms"]["median"] / r["ttft_ms"]["median"] if t else float("nan")
            rate = r["decode_tokens_per_s"]["median"]
            decode_x = rate / t["decode_tokens_per_s"]["median"] if t else float("nan")
            peak = "-" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
            lines.append(
                f"{path_id:20} {batch:>5} {_stat(r['ttft_ms'], 2):>28} {ttft_x:>7.2f} "
                f"{_stat(r['decode_tokens_per_s'], 1):>30} {decode_x:>8.2f} {peak:>9} "
                f"{r['cache_bytes'] / 2**20:>9.2f} {r['ttft_ms']['n']:>5}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", choices=list(SHAPES), help="tiny, 135m (default: both)")
    parser.add_argument("--path", action="append", choices=list(PATHS), help="a path (repeatable; default: all)")
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, action="append", help="a batch size (repeatable; default: 1 and 4)")
    parser.add_argument("--budget", type=float, default=5.0, help="seconds of timed generations per batch size")
    parser.add_argument("--min-runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/generation_speed"))
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args(argv)
    args.batch = args.batch or [1, 4]
    if args.prompt_length < 1 or args.new_tokens < 2 or min(args.batch) < 1 or args.budget <= 0 or args.threads < 1:
        print("prompt length >= 1, new tokens >= 2, batch sizes >= 1, budget > 0, threads >= 1", file=sys.stderr)
        return 2
    paths = args.path or list(PATHS)
    if "torch" not in paths:
        paths.insert(0, "torch")  # the ratios' base
    root = args.workdir.resolve()
    results = {}
    for shape in args.shape or list(SHAPES):
        made = prepare(shape, root, paths)
        results[shape] = time_paths(shape, made, paths, args)
        print()
        print(table(shape, results[shape], args.batch), flush=True)
        print()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(row.get("verdict") != "error" for rows in results.values() for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
