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
"""

from __future__ import annotations

import math

from parity.bench.footprint import memory_change
from parity.bench.stats import compare_series_log, ratio_text
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


def findings(baseline: dict, current: dict, history: dict | None = None) -> tuple[list[str], list[str]]:
    """(what fails the comparison, what was withheld), one line each; ``history``: (model, path, batch) -> earlier
    medians of that series on this hardware."""
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
            ratio, (lo, hi) = math.exp(c["log_ratio"]), c["log_ci95"]
            noise = max(_noise(ea), _noise(eb), past_noise((history or {}).get((*key, batch), [])), NOISE_FLOOR)
            if c["significant"] and abs(ratio - 1.0) > noise:
                word = "slower" if ratio > 1 else "faster"
                failing.append(
                    f"{where}: {ratio_text(ratio)} ({word}; 95% CI [{ratio_text(math.exp(lo))}, "
                    f"{ratio_text(math.exp(hi))}], p {c['p']:.2g}; noise +-{100 * noise:.1f}%), median "
                    f"{ea['median_ms']:.4g} -> {eb['median_ms']:.4g} ms"
                )
    return failing, withheld


def render(baseline: dict, current: dict, differ: list[str], history: dict | None = None) -> tuple[str, int]:
    """The text shown after the run, and its exit code (1 when anything fails the comparison)."""
    ra, rb = compare._by_key(baseline), compare._by_key(current)
    common = [k for k in rb if k in ra]
    lines = [f"Against run {baseline.get('run_id')}"]
    lines += [f"  {line}" for line in compare._environment(baseline, current, common, ra, rb)]
    lines += [f"  warning: compared on a different {d} (--allow-different-env)" for d in differ]
    failing, withheld = findings(baseline, current, history)
    lines += [f"  changed: {line}" for line in failing]
    lines += [f"  withheld: {line}" for line in withheld]
    if not failing:
        lines.append(
            f"  no verdict changed and no timing or peak memory changed beyond its noise ({len(common)} paths in both)"
        )
    return "\n".join(lines), 1 if failing else 0
