"""``--against last|RUN_ID``: this run against a baseline run from the store.

Differences in environment are shown first (as ``parity compare`` does); then what fails the comparison (exit code
1): a verdict that changed, a peak memory that moved past ``footprint.memory_change``'s thresholds, a timing whose
change is significant (the ratio's 95 % CI excludes 1 and Welch's test
gives p < 0.05) and larger than the series' noise, and a series voided by its output audit. The noise is the largest
of: half the interquartile range over the median of either series (run to run), the process-to-process cv where
``--processes`` measured it, the variation of the series' medians over its earlier stored runs on this hardware
(robust: 1.4826 MAD of their logs, from three runs on), and ``NOISE_FLOOR``: runs in separate processes differ by
a few percent on any machine, which no single run can see. Comparisons with a series that did not settle are withheld and said.
A baseline on other hardware, device or precision is refused unless allowed, and then every difference is listed.

A generation path (``generation.timing``) is compared at each batch size timed in both runs by its time to first token
and its decode step time, from the raw samples (one per generation) with the same test, noise and wording; every such
comparison is listed in the block, and one beyond its noise fails it as a forward path's does. A series whose median's
95 % interval is wider than +-``SETTLED`` is withheld, as is a pair timed with another prompt length, number of new
tokens or thread count (not the same work).
"""

from __future__ import annotations

import math

from parity.bench.footprint import memory_change
from parity.bench.stats import compare_series_log, median, median_ci, ratio_text
from parity.platform.errors import UsageError
from parity.report import compare


def check_environment(baseline: dict, hardware: str, device: str, precision: str, allow: bool) -> list[str]:
    """What differs between the baseline run and this one in hardware, device and precision; ``UsageError`` unless
    ``allow`` where anything does."""
    from parity.results.store import hardware as hardware_of

    results = baseline.get("results") or [{}]
    theirs = {
        "hardware": hardware_of(baseline.get("env") or {}),
        "device": results[0].get("device") or "cpu",
        "precision": results[0].get("precision") or "fp32",
    }
    ours = {"hardware": hardware, "device": device, "precision": precision}
    differ = [f"{k} {theirs[k]} -> {ours[k]}" for k in theirs if theirs[k] != ours[k]]
    if differ and not allow:
        raise UsageError(
            f"baseline run {baseline.get('run_id')} was measured with a different {'; '.join(differ)}: "
            "its numbers are not comparable (--allow-different-env compares anyway, listing this)"
        )
    return differ


NOISE_FLOOR = 0.05


def _noise(entry: dict) -> float:
    spread = entry.get("spread")
    own = 0.5 * spread if isinstance(spread, (int, float)) and math.isfinite(spread) else 0.0
    return max(own, (entry.get("processes") or {}).get("between_processes_cv") or 0.0)


def past_noise(medians: list[float]) -> float:
    """Variation between runs from earlier medians of one series: 1.4826 MAD of their logs (0 below three)."""
    if len(medians) < 3:
        return 0.0
    logs = sorted(math.log(m) for m in medians if m and m > 0)
    mid = logs[len(logs) // 2]
    deviations = sorted(abs(x - mid) for x in logs)
    return 1.4826 * deviations[len(deviations) // 2]


def findings(
    baseline: dict, current: dict, history: dict | None = None, generated: list[dict] | None = None
) -> tuple[list[str], list[str]]:
    """(what fails the comparison, what was withheld), one line each; ``history``: (model, path, batch) -> earlier
    medians of that series on this hardware (and (model, path, batch, measure) for a generation series);
    ``generated``: the generation comparisons where already made (``generation``)."""
    failing, withheld = [], []
    old, new = compare._by_key(baseline), compare._by_key(current)
    for key in [k for k in new if k in old]:
        a, b = old[key], new[key]
        label = f"{key[0]} {key[1]}"
        if compare._verdict(a) != compare._verdict(b):
            failing.append(f"{label}: verdict {compare._verdict(a)} -> {compare._verdict(b)}")
        timing_a, timing_b = a.get("timing") or {}, b.get("timing") or {}
        for batch, eb in (timing_b.get("batches") or {}).items():
            ea = (timing_a.get("batches") or {}).get(batch)
            if not ea:
                continue
            where = f"{label} batch {batch}"
            if eb.get("verdict") == "invalid":
                failing.append(f"{where}: {eb.get('reason')}")
                continue
            if ea.get("verdict") != "pass" or eb.get("verdict") != "pass":
                continue
            unsettled = [
                who
                for who, e in (("the baseline's", ea), ("this run's", eb))
                if not (e.get("stability") or {}).get("ok", True)
            ]
            if unsettled:
                withheld.append(f"{where}: not compared, {' and '.join(unsettled)} series did not settle")
                continue
            peak_a, peak_b = ((e.get("memory") or {}).get("peak_rss_mb") for e in (ea, eb))
            word = memory_change(peak_a, peak_b)
            if word and peak_a is not None and peak_b is not None:  # a change is only told of two known peaks
                failing.append(
                    f"{where}: peak memory {ratio_text(peak_b / max(peak_a, 1e-9))} ({word}), "
                    f"{peak_a:.0f} -> {peak_b:.0f} MB"
                )
            sa, sb = compare._samples(ea), compare._samples(eb)
            if not sa or not sb:
                continue
            c = compare_series_log(sb, sa)
            noise = max(_noise(ea), _noise(eb), past_noise((history or {}).get((*key, batch), [])), NOISE_FLOOR)
            if _beyond(c, noise):
                failing.append(f"{where}: {_change_text(c, noise, ea['median_ms'], eb['median_ms'])}")
    for row in generation(baseline, current, history) if generated is None else generated:
        if row.get("failing"):
            failing.append(f"{row['where']}: {row['text']}")
        elif row.get("withheld"):
            withheld.append(f"{row['where']}: {row['withheld']}")
    return failing, withheld


def _beyond(c: dict, noise: float) -> bool:
    """Whether a comparison (``compare_series_log``) is a change: significant, and larger than the noise."""
    return bool(c["significant"]) and abs(math.exp(c["log_ratio"]) - 1.0) > noise


def _change_text(c: dict, noise: float, before_ms: float, after_ms: float) -> str:
    """``1.5x (slower; 95% CI [..], p ..; noise +-5.0%), median a -> b ms``; the word is ``no significant
    difference`` where the CI holds 1 or Welch's p is not below 0.05, ``within noise`` where the change is smaller
    than the noise."""
    ratio, (lo, hi) = math.exp(c["log_ratio"]), c["log_ci95"]
    word = (
        ("slower" if ratio > 1 else "faster")
        if _beyond(c, noise)
        else ("within noise" if c["significant"] else "no significant difference")
    )
    return (
        f"{ratio_text(ratio)} ({word}; 95% CI [{ratio_text(math.exp(lo))}, {ratio_text(math.exp(hi))}], "
        f"p {c['p']:.2g}; noise +-{100 * noise:.1f}%), median {before_ms:.4g} -> {after_ms:.4g} ms"
    )


# --- generation paths -----------------------------------------------------------------------------------------------

MEASURES = (("ttft", "time to first token"), ("decode_step", "decode step"))
SETTLED = 0.10  # the widest median interval compared: stats.stability's bound at the default target
SAME_WORK = (("prompt_length", "prompt length"), ("new_tokens", "new tokens"), ("threads", "threads"))


def _generation_timing(result: dict) -> dict:
    block = result.get("generation")
    timing = block.get("timing") if isinstance(block, dict) else None
    return timing if isinstance(timing, dict) else {}


def _generation_samples(entry, measure: str) -> list[float] | None:
    """The raw samples (ms, one per generation) of ``measure`` in a batch's timing row; None where there are not two
    positive finite ones."""
    samples = entry.get("samples_ms") if isinstance(entry, dict) else None
    return compare._samples({"samples_ms": samples.get(measure)}) if isinstance(samples, dict) else None


def _settled(samples: list[float]) -> bool:
    middle = median(samples)
    lo, hi = median_ci(samples)
    return max(middle - lo, hi - middle) <= SETTLED * middle


def _spread_noise(samples: list[float]) -> float:
    """Half the interquartile range over the median, as a forward series' ``spread`` gives its noise."""
    import numpy as np

    q1, q3 = np.percentile(samples, [25, 75])
    return 0.5 * float(q3 - q1) / median(samples)


def generation(baseline: dict, current: dict, history: dict | None = None) -> list[dict]:
    """Each generation series timed in both runs: ``{"where", "path", "batch", "measure", "before_ms", "after_ms",
    "text", "failing"}``, or ``{"where", "withheld"}`` where it was not compared. ``history``: (model,
    path, batch, measure) -> earlier medians of that series on this hardware."""
    old, new = compare._by_key(baseline), compare._by_key(current)
    rows: list[dict] = []
    for key in [k for k in new if k in old]:
        ta, tb = _generation_timing(old[key]), _generation_timing(new[key])
        label = f"{key[0]} {key[1]}"
        batches_a, batches_b = ta.get("batches"), tb.get("batches")
        if not isinstance(batches_a, dict) or not isinstance(batches_b, dict):
            untimed = [
                f"{who} timing: {timing['verdict']}, {timing.get('reason') or 'no reason recorded'}"
                for who, timing in (("the baseline's", ta), ("this run's", tb))
                if timing.get("verdict") in ("error", "skip")
            ]
            if untimed and (isinstance(batches_a, dict) or isinstance(batches_b, dict)):
                rows.append({"where": f"{label} generation", "withheld": f"not compared, {'; '.join(untimed)}"})
            continue
        other = [
            f"{name} {ta.get(field)} -> {tb.get(field)}" for field, name in SAME_WORK if ta.get(field) != tb.get(field)
        ]
        for batch in sorted(set(batches_a) & set(batches_b), key=compare._batch_order):
            for measure, title in MEASURES:
                where = f"{label} batch {batch} {title}"
                if other:
                    rows.append(
                        {"where": where, "withheld": f"not compared, timed with a different {', '.join(other)}"}
                    )
                    continue
                sa, sb = (_generation_samples(b[batch], measure) for b in (batches_a, batches_b))
                if not sa or not sb:
                    rows.append({"where": where, "withheld": "not compared, no raw samples in both runs"})
                    continue
                unsettled = [who for who, s in (("the baseline's", sa), ("this run's", sb)) if not _settled(s)]
                if unsettled:
                    rows.append(
                        {
                            "where": where,
                            "withheld": f"not compared, {' and '.join(unsettled)} series did not settle (median's "
                            f"95% interval wider than +-{100 * SETTLED:.0f}%)",
                        }
                    )
                    continue
                c = compare_series_log(sb, sa)
                past = past_noise((history or {}).get((*key, batch, measure), []))
                noise = max(_spread_noise(sa), _spread_noise(sb), past, NOISE_FLOOR)
                rows.append(
                    {
                        "where": where,
                        "path": label,
                        "batch": batch,
                        "measure": title,
                        "before_ms": median(sa),
                        "after_ms": median(sb),
                        "text": _change_text(c, noise, median(sa), median(sb)),
                        "failing": _beyond(c, noise),
                    }
                )
    return rows


def _generation_lines(rows: list[dict]) -> list[str]:
    """Every generation series compared, one line each (those withheld are said with the other withheld ones)."""
    compared = [r for r in rows if "text" in r]
    if not compared:
        return []
    lines = ["  generation timing (this run / the baseline: ratio of the medians, 95% CI and p from the raw samples):"]
    return lines + [f"    {r['where']}: {r['text']}" for r in compared]


def render(baseline: dict, current: dict, differ: list[str], history: dict | None = None) -> tuple[str, int]:
    """The text shown after the run, and its exit code (1 when anything fails the comparison)."""
    ra, rb = compare._by_key(baseline), compare._by_key(current)
    common = [k for k in rb if k in ra]
    lines = [f"Against run {baseline.get('run_id')}"]
    lines += [f"  {line}" for line in compare._environment(baseline, current, common, ra, rb)]
    lines += [f"  warning: compared on a different {d} (--allow-different-env)" for d in differ]
    generated = generation(baseline, current, history)
    failing, withheld = findings(baseline, current, history, generated)
    lines += [f"  changed: {line}" for line in failing]
    lines += [f"  withheld: {line}" for line in withheld]
    lines += _generation_lines(generated)
    if not failing:
        lines.append(
            f"  no verdict changed and no timing or peak memory changed beyond its noise ({len(common)} paths in both)"
        )
    return "\n".join(lines), 1 if failing else 0
