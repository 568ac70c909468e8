#!/usr/bin/env python
"""Llama models of random weights at the sizes users convert, through the command line: seconds, memory, golden size.

For each size, in a fresh workspace, a ``transformers`` ``LlamaForCausalLM`` of random weights (seed 0) with one
RMSNorm that the ONNX export computes with another epsilon (``model.layers.<middle>.post_attention_layernorm``: eps
1e-1 while ``torch.onnx.is_in_onnx_export()``) goes through the commands as a user's would, each in a subprocess:
``parity init llama --torch llama.py:make_model --input input_ids=2x64:int64:<vocab>`` -> ``golden build`` ->
``check --path torch --path torch/onnx/ort`` (which diagnoses the failing path). Per step: wall seconds, the peak
resident memory of the largest process of the command's process tree and of the whole tree (psutil, every 0.5 s),
the golden folder's size, the exit code and, for the check, each path's verdict, whether its diagnosis named the
faulty layer, and the seconds of each stage. The worker service is off (``PARITY_WORKER_SERVICE=off``), so that
every worker is a child of the command it measures (the tree's sum counts pages a forked worker shares with its
template twice). Sizes: 20M (hidden 256, 8 layers, 8/4 heads), 135M (SmolLM-135M's shape), 1.1B (TinyLlama-1.1B's).

``--mapped``: the model's weights are saved first (``save_pretrained``, float32 safetensors, in a process of its own)
and declared with ``init --weights``: they are memory-mapped into the architecture, and the float64 reference streams
from them (``parity.model.weight_files``). Resident memory then counts the files' pages a process touched, which the
kernel may drop again; the anonymous memory (``RssAnon``, what cannot be dropped) is measured beside it.
``--memory-limit SIZE`` runs every command under ``PARITY_MEMORY_LIMIT=SIZE`` (a machine with that much memory).

    python scripts/scale_models.py [--sizes 20M,135M] [--timeout S] [--out table.json] [--keep DIR] [--mapped]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
GB = 1024**3
FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
FIELDS += ("vocab_size", "tie_word_embeddings")
SIZES = {  # name -> LlamaConfig fields (rms_norm_eps 1e-5 for all)
    "20M": dict(zip(FIELDS, (256, 8, 8, 4, 768, 32000, False))),
    "135M": dict(zip(FIELDS, (576, 30, 9, 3, 1536, 49152, True))),  # SmolLM-135M
    "1.1B": dict(zip(FIELDS, (2048, 22, 32, 4, 5632, 32000, False))),  # TinyLlama-1.1B
}
FACTORY = '''"""A Llama of random weights whose layer {layer} RMSNorm is exported with eps 1e-1."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

CONFIG = {config!r}


class ExportEpsRMSNorm(LlamaRMSNorm):
    """LlamaRMSNorm; computed with ``export_eps`` instead of its own eps while torch.onnx exports it."""

    def __init__(self, hidden_size, eps, export_eps):
        super().__init__(hidden_size, eps=eps)
        self.export_eps = export_eps

    def forward(self, hidden_states):
        if not torch.onnx.is_in_onnx_export():
            return super().forward(hidden_states)
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.export_eps)
        return self.weight * hidden_states.to(input_dtype)


def make_model():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, rms_norm_eps=1e-5, max_position_embeddings=128, use_cache=False))
    layer = model.model.layers[{layer}]
    old = layer.post_attention_layernorm
    layer.post_attention_layernorm = ExportEpsRMSNorm(
        old.weight.shape[0], eps=old.variance_epsilon, export_eps=1e-1
    )
    return model.eval()
'''


def params(config: dict) -> int:
    """The parameter count of a Llama of ``config``, without building it."""
    h, n, i, v = (config[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"))
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return v * h * (1 if config["tie_word_embeddings"] else 2) + n * layer + h


class Peak:
    """Samples the resident memory of a process and all its descendants every ``period`` seconds: the largest
    process's peak and the peak of the sum."""

    def __init__(self, pid: int, period: float = 0.5):
        self.root, self.period = psutil.Process(pid), period
        self.per_process: dict[int, int] = {}
        self.anonymous: dict[int, int] = {}
        self.tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for process in processes:
                try:
                    rss = process.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                self.per_process[process.pid] = max(self.per_process.get(process.pid, 0), rss)
                self.anonymous[process.pid] = max(self.anonymous.get(process.pid, 0), _anonymous(process.pid))
            self.tree = max(self.tree, total)
            self._stop.wait(self.period)

    def stop(self) -> tuple[float, float, float]:
        """(largest process GB, tree GB, largest process's anonymous GB)."""
        self._stop.set()
        self._thread.join()
        largest = max(self.per_process.values(), default=0) / GB
        return largest, self.tree / GB, max(self.anonymous.values(), default=0) / GB


def _anonymous(pid: int) -> int:
    """A process's anonymous resident bytes (``RssAnon``: not pages of a file), 0 where it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:")), 0)
    except OSError:
        return 0


def parity(root: Path, log, *args: str, limit: str | None = None) -> dict:
    """``parity ARGS`` in ``root`` with its output to ``log``: seconds, peak memory, exit code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["PARITY_WORKER_SERVICE"] = "off"  # workers are the command's own children, not a shared service's
    if limit:
        env["PARITY_MEMORY_LIMIT"] = limit
    log.write(f"$ parity {' '.join(args)}\n")
    log.flush()
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "parity.cli", *args], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    peak = Peak(process.pid)
    code = process.wait()
    largest, tree, anonymous = peak.stop()
    return {
        "seconds": time.perf_counter() - started,
        "peak_process_gb": largest,
        "peak_anonymous_gb": anonymous,
        "peak_tree_gb": tree,
        "exit": code,
    }


def planned(root: Path) -> dict:
    """``parity plan --model llama``'s estimate for each stage: its largest step's peak (GB) and its seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "parity.cli", "plan", "--model", "llama", "--json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return {}
    stages: dict = {}
    for step in json.loads(done.stdout)["steps"]:
        peak, seconds = stages.get(step["stage"], (0.0, 0.0))
        stages[step["stage"]] = (max(peak, step["peak_bytes"] / GB), seconds + step["seconds"])
    return stages


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6 if folder.exists() else 0.0


def check_result(path: Path, faulty: str) -> str:
    """Each path's verdict from the check's JSON, and for a diagnosed one whether it named the faulty layer."""
    if not path.exists():
        return "no JSON written"
    report, parts = json.loads(path.read_text()), []
    for result in report["results"]:
        text = f"{result['path']} {result['verdict']}"
        if result["verdict"] == "error":
            text += f" ({' '.join((result.get('reason') or '').split())[:200]})"
        diagnosis = result.get("diagnosis") or {}
        if diagnosis:
            trail = diagnosis.get("first_divergent_path") or []
            where = trail[-1] if trail else diagnosis.get("first_divergent_tap") or diagnosis.get("error") or "-"
            named = bool(trail) and trail[-1] == faulty
            text += f" (diagnosis: {where}; faulty layer {'named' if named else 'NOT named'})"
        parts.append(text)
    stages = report.get("stage_seconds") or {}
    parts.append("stages " + ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in stages.items()))
    return "; ".join(parts)


def save_weights(root: Path) -> None:
    """The factory's model saved to ``root/weights`` (float32 safetensors), in a process of its own."""
    code = "import llama; llama.make_model().save_pretrained('weights')"
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True)


def one(size: str, root: Path, timeout: float | None, mapped: bool = False, memory: str | None = None) -> list[dict]:
    """The three steps of one size in workspace ``root``: a row per step."""
    config = SIZES[size]
    layer = config["num_hidden_layers"] // 2
    faulty = f"model.layers.{layer}.post_attention_layernorm"
    (root / "llama.py").write_text(FACTORY.format(config=config, layer=layer))
    if mapped:
        save_weights(root)
    limit = ["--timeout", str(timeout)] if timeout else []
    steps = {
        "init": ["init", "llama", "--torch", "llama.py:make_model", "--input"]
        + [f"input_ids=2x64:int64:{config['vocab_size']}"]
        + (["--weights", "weights"] if mapped else []),
        "golden build": ["golden", "build", "--model", "llama"],
        "check": ["check", "--model", "llama", "--path", "torch", "--path", "torch/onnx/ort", "--json", "check.json"]
        + limit,
    }
    rows = []
    base = {"size": size, "params": params(config), "faulty": faulty}
    plan: dict = {}
    with open(root / "parity.log", "w") as log:
        for step, args in steps.items():
            measured = parity(root, log, *args, limit=memory)
            row = {**base, "step": step, **measured, "golden_mb": folder_mb(root / "golden")}
            if step == "init":
                plan = planned(root)
            row["planned_gb"], row["planned_s"] = plan.get(step, (None, None))
            row["result"] = f"exit {row['exit']}"
            if step == "check":
                row["result"] += "; " + check_result(root / "check.json", faulty)
            rows.append(row)
            print(f"{size} {step}: {row['seconds']:.0f} s, exit {row['exit']}", file=sys.stderr, flush=True)
            if row["exit"] not in (0, 1) or (row["exit"] and step != "check"):
                tail = (root / "parity.log").read_text().strip().splitlines()[-1:] or [""]
                row["result"] += f": {tail[0][:200]}"
                break
    return rows


def table(rows: list[dict]) -> str:
    heads = ("size", "params", "step", "seconds", "planned s", "peak largest process GB", "its anonymous GB")
    heads += ("planned GB", "peak tree GB", "golden MB", "result")
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        cells = (r["size"], f"{r['params'] / 1e6:.1f}M", r["step"], f"{r['seconds']:.0f}")
        cells += (
            _or_dash(r.get("planned_s"), ".0f"),
            f"{r['peak_process_gb']:.2f}",
            f"{r.get('peak_anonymous_gb', 0):.2f}",
            _or_dash(r.get("planned_gb"), ".2f"),
        )
        cells += (f"{r['peak_tree_gb']:.2f}", f"{r['golden_mb']:.0f}", r["result"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _or_dash(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--timeout", type=float, help="passed to parity check (seconds one export or check may take)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the workspaces under this folder (created if missing)")
    parser.add_argument("--mapped", action="store_true", help="declare the weights' safetensors files (init --weights)")
    parser.add_argument("--memory-limit", help="PARITY_MEMORY_LIMIT for every command, e.g. 4G")
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = sorted(set(sizes) - set(SIZES))
    if unknown or not sizes:
        parser.error(f"unknown size(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(SIZES)}")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes:
        root = Path(tempfile.mkdtemp(prefix=f"parity-scale-{size}-", dir=args.keep))
        try:
            rows += [
                {**row, "workspace": str(root)} if args.keep else row
                for row in one(size, root, args.timeout, args.mapped, args.memory_limit)
            ]
        finally:
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
        if args.out:  # after every size, so that a long run leaves what it measured
            args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
