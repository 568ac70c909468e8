"""The generation config matrix: tiny random-weight causal LMs across the knobs that break converters, each through
``parity init --hf FOLDER --task text-generation``, ``parity golden build`` and ``parity check --json`` on every
generation path, printed as a table (config x path: pass / FAIL at step k (mode, batch) / error / skip) with the
golden build and check seconds.

    python scripts/generation_matrix.py                      # every tiny config
    python scripts/generation_matrix.py -c mistral_sw -c phi3_longrope --path torch --path 'torch/onnx/ort'
    python scripts/generation_matrix.py --size 135m          # one Llama of SmolLM-135M's shape: the costs
    python scripts/generation_matrix.py --list

The knobs: grouped-query ratios (heads / kv heads 1, 2, 4, 8), a head size that is not hidden / heads, rope variants
(default, linear, dynamic, llama3, Phi-3's longrope with its switch length inside the prompt), a sliding window
shorter than the prompt (Mistral, Gemma-2), softcapping and embedding scale (Gemma-2), q/k/v bias (Qwen2), tied
embeddings, and GPT-2. Random initialisation leaves biases at 0 and norm weights at their neutral value; the folders
get random biases and norm weights, so a dropped bias or norm weight changes the logits. Prompts (12, 7) and 8 new
tokens cross a window of 4 and a longrope switch at 8 (or at 14 in decode). Each folder carries a word-level
tokenizer (``torch/genai`` needs one). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PROMPT_LENGTHS = (12, 7)
NEW_TOKENS = 8


def _longrope(original: int, head_dim: int = 16) -> dict:
    half = head_dim // 2
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(half)],
        "long_factor": [2.0 + 0.5 * i for i in range(half)],
        "original_max_position_embeddings": original,
    }


# name -> (model_type, config overrides, attention implementation, what it exercises)
CONFIGS: dict[str, tuple[str, dict, str, str]] = {
    "llama_gqa1": ("llama", {"num_key_value_heads": 4}, "sdpa", "heads/kv 1 (multi-head)"),
    "llama_gqa2": ("llama", {}, "sdpa", "heads/kv 2"),
    "llama_gqa4": (
        "llama",
        {"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2},
        "sdpa",
        "heads/kv 4",
    ),
    "llama_gqa8": (
        "llama",
        {"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 1},
        "sdpa",
        "heads/kv 8 (multi-query)",
    ),
    "llama_head8": ("llama", {"num_attention_heads": 8, "num_key_value_heads": 2}, "sdpa", "head size 8"),
    "llama_headdim": ("llama", {"head_dim": 32}, "sdpa", "head size 32, hidden/heads 16"),
    "llama_tied": ("llama", {"tie_word_embeddings": True}, "sdpa", "tied embeddings"),
    "llama_rope_linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "sdpa", "rope linear x2"),
    "llama_rope_dynamic": (
        "llama",
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 16},
        "sdpa",
        "rope dynamic NTK, max positions 16 < 12 + 8",
    ),
    "llama_rope_llama3": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
        "sdpa",
        "rope llama3",
    ),
    "qwen2_bias": ("qwen2", {}, "sdpa", "q/k/v bias (random)"),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 1}, "sdpa", "tied, heads/kv 4"),
    "mistral": ("mistral", {"sliding_window": 4096}, "sdpa", "Mistral, window above the sequence"),
    "mistral_sw": ("mistral", {"sliding_window": 4}, "sdpa", "sliding window 4 < prompt 12"),
    "phi3": ("phi3", {"original_max_position_embeddings": 512}, "sdpa", "Phi-3, fused qkv and gate/up"),
    "phi3_longrope": (
        "phi3",
        {"rope_scaling": _longrope(8), "original_max_position_embeddings": 8, "max_position_embeddings": 64},
        "sdpa",
        "longrope, switch at 8 inside the prompt",
    ),
    "phi3_longrope_decode": (
        "phi3",
        {"rope_scaling": _longrope(14), "original_max_position_embeddings": 14, "max_position_embeddings": 64},
        "sdpa",
        "longrope, switch at 14 during decode",
    ),
    "gemma2": ("gemma2", {"head_dim": 32, "sliding_window": 32}, "eager", "softcapping, embedding scale, head 32"),
    "gemma2_sw": (
        "gemma2",
        {"head_dim": 16, "sliding_window": 4, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0},
        "eager",
        "window 4, softcapping that bites",
    ),
    "gpt2": (
        "gpt2",
        {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512, "vocab_size": 256, "tie_word_embeddings": True},
        "eager",
        "GPT-2 (learned positions, Conv1D)",
    ),
}
GPT2_DROP = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"}
SMOLLM_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
}


def tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer over ``w3``..``w{vocab-1}`` (ids 0, 1, 2: pad, bos, eos)."""
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


def build(model_type: str, overrides: dict, attn: str, folder: Path, seed: int, base: dict | None = None) -> None:
    """A random-weight model of ``model_type`` (random biases and norm weights too) saved with a tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(TINY if base is None else {**TINY, **base})
    if model_type == "gpt2":
        settings = {k: v for k, v in settings.items() if k not in GPT2_DROP}
    config = AutoConfig.for_model(model_type, **{**settings, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.05)
            elif "norm" in name or name.split(".")[-2].startswith("ln_"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(folder)
    tokenizer(folder, config.vocab_size)


def _run(args: list[str], env: dict, timeout: float) -> tuple[int, str, float, float | None]:
    """(exit code, output, seconds, peak RSS in MiB of the command's processes that were waited for)."""
    probe = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(r.returncode)"
    )
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe, sys.executable, "-m", "parity", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s", time.perf_counter() - start, None
    seconds = time.perf_counter() - start
    peak = re.search(r"PEAK_RSS_KB (\d+)", done.stderr)
    return done.returncode, done.stdout + done.stderr, seconds, int(peak.group(1)) / 1024 if peak else None


def _set_spec(spec: Path, prompt_lengths: tuple[int, ...], new_tokens: int, paths: list[str] | None) -> None:
    text = spec.read_text()
    text = re.sub(r"prompt_lengths=\([^)]*\)", f"prompt_lengths={tuple(prompt_lengths)!r}", text)
    text = re.sub(r"new_tokens=\d+", f"new_tokens={new_tokens}", text)
    if paths:
        text = text.replace("    seed=", f"    paths={tuple(paths)!r},\n    seed=", 1)
    spec.write_text(text)


def _cell(row: dict) -> str:
    verdict = row.get("verdict")
    if verdict == "pass":
        return "pass"
    if verdict == "fail":
        gen = row.get("generation") or {}
        if gen.get("first_divergent_step") is not None:
            return f"FAIL at step {gen['first_divergent_step']} ({gen.get('mode')}, {gen.get('batch')})"
        failing = [k for k, c in (gen.get("consistency") or {}).items() if c.get("ok") is False]
        return f"FAIL consistency {','.join(failing)}" if failing else "FAIL " + (row.get("reason") or "")[:60]
    reason = (row.get("reason") or "").splitlines()[0] if row.get("reason") else ""
    return f"{verdict}: {reason[:90]}"


def one(
    name: str, spec: tuple, root: Path, env: dict, paths: list[str] | None, timeout: float, base: dict | None = None
) -> dict:
    model_type, overrides, attn, _ = spec
    folder = root / f"{name}_hf"
    result: dict = {"config": name, "paths": {}}
    try:
        if not folder.is_dir():
            build(model_type, overrides, attn, folder, seed=sum(map(ord, name)), base=base)
    except (ValueError, TypeError, KeyError, NotImplementedError) as error:  # a config transformers refuses
        result["error"] = f"build: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        return result
    code, out, _, _ = _run(
        ["init", name, "--hf", str(folder), "--task", "text-generation", "-w", str(root), "--force"], env, 120
    )
    if code != 0:
        result["error"] = f"init: {out.strip().splitlines()[-1][:120] if out.strip() else code}"
        return result
    _set_spec(root / "models" / f"{name}.py", PROMPT_LENGTHS, NEW_TOKENS, None)
    code, out, result["golden_s"], result["golden_rss_mb"] = _run(
        ["golden", "build", "--model", name, "-w", str(root)], env, timeout
    )
    if code != 0:
        result["error"] = f"golden build: {out.strip().splitlines()[-1][:120] if out.strip() else code}"
        return result
    report = root / f"{name}.json"
    report.unlink(missing_ok=True)
    selection = [a for p in paths or [] for a in ("--path", p)]
    code, out, result["check_s"], result["check_rss_mb"] = _run(
        ["check", "--model", name, "-w", str(root), "--json", str(report), *selection], env, timeout
    )
    if not report.is_file():
        result["error"] = f"check exit {code}: {out.strip().splitlines()[-1][:120] if out.strip() else ''}"
        return result
    for row in json.loads(report.read_text())["results"]:
        result["paths"][row["path"]] = row
    return result


def table(results: list[dict], paths: list[str]) -> str:
    width = max(len(p) for p in paths)
    cells = {r["config"]: {p: (_cell(r["paths"][p]) if p in r["paths"] else "-") for p in paths} for r in results}
    widths = [max(len("config"), *(len(r["config"]) for r in results))]
    widths += [max(width, *(len(cells[r["config"]][p]) for r in results)) for p in paths]
    head = ["config", *paths, "golden s", "check s"]
    lines = [" | ".join(h.ljust(w) for h, w in zip(head, widths + [8, 8]))]
    lines.append("-|-".join("-" * w for w in widths + [8, 8]))
    for r in results:
        if "error" in r:
            lines.append(f"{r['config'].ljust(widths[0])} | error: {r['error']}")
            continue
        row = [r["config"], *(cells[r["config"]][p] for p in paths)]
        row += [f"{r.get('golden_s', 0):.1f}", f"{r.get('check_s', 0):.1f}"]
        lines.append(" | ".join(c.ljust(w) for c, w in zip(row, widths + [8, 8])))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from parity.model.generation_spec import PATHS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", action="append", help="a config name (repeatable; default: all)")
    parser.add_argument("--path", action="append", help="a path glob passed to check (repeatable; default: all)")
    parser.add_argument("--size", choices=["tiny", "135m"], default="tiny")
    parser.add_argument("--workspace", type=Path, default=Path("/tmp/generation_matrix"))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per golden build or check")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--list", action="store_true", help="list the configs and what each exercises")
    args = parser.parse_args(argv)
    if args.list:
        for name, (model_type, _, _, what) in CONFIGS.items():
            print(f"{name:22} {model_type:8} {what}")
        return 0
    unknown = sorted(set(args.config or []) - set(CONFIGS))
    if unknown:
        print(f"unknown config(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    root = args.workspace.resolve()
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.size == "135m":
        todo = {"llama_135m": ("llama", {}, "sdpa", "SmolLM-135M's shape")}
        base = SMOLLM_135M
    else:
        todo = {name: CONFIGS[name] for name in (args.config or CONFIGS)}
        base = None
    results = []
    for name, spec in todo.items():
        result = one(name, spec, root, env, args.path, args.timeout, base)
        results.append(result)
        cells = {p: _cell(r) for p, r in result["paths"].items()}
        print(
            f"{name}: {result.get('error') or cells} golden {result.get('golden_s', 0):.1f} s, "
            f"check {result.get('check_s', 0):.1f} s",
            flush=True,
        )
    print()
    print(table(results, list(PATHS)))
    if args.size == "135m":
        for r in results:
            print(
                f"{r['config']}: golden build {r.get('golden_s', 0):.1f} s (peak RSS {r.get('golden_rss_mb') or 0:.0f} MiB), "
                f"check {r.get('check_s', 0):.1f} s (peak RSS {r.get('check_rss_mb') or 0:.0f} MiB)"
            )
    if args.json:
        slim = [
            {k: v for k, v in r.items() if k != "paths"}
            | {
                "paths": {
                    p: {k: row.get(k) for k in ("verdict", "reason", "generation")} for p, row in r["paths"].items()
                }
            }
            for r in results
        ]
        args.json.write_text(json.dumps(slim, indent=1, default=str))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
