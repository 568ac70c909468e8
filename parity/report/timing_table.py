"""The benchmark tables: per path and batch size (only verified paths have numbers), training steps,
time to first result by part, and stability warnings; each table with a legend of its columns, and every
figure that depends on a batch size beside a ``batch`` column that names it."""

from __future__ import annotations

import textwrap

from parity.bench.stats import CV_WARNING, ratio_text
from parity.report import quantized
from parity.report.terminal import WRAP, _label, _legend, _table

_LOCKED: dict[bool | None, str] = {True: "locked", False: "not locked"}  # the clocks' lock, where known
TIMING_LEGEND = [
    ("batch", "the batch size the row was exported at, verified at (its outputs on that many eval samples"),
    ("", "against the golden) and timed at; every figure of the row is for one call at that batch"),
    ("median ms", "median time of one call at that batch: input ready on the host -> outputs on the host"),
    ("95% CI ms", "distribution-free 95 % confidence interval of that median"),
    ("spread", "interquartile range of the timed runs / their median (robust to outliers, unlike std / mean)"),
    ("p99 ms", "99th percentile, shown from the 299 runs a 95 % bound on it needs (-: fewer runs)"),
    ("runs", "timed runs, after the warm-up"),
    ("samples/s", "batch / median: samples per second at that batch"),
    ("vs baseline", "median / the baseline's median at the same batch [95 % CI]; faster or slower only when"),
    ("", "that CI excludes 1 and Welch's t-test on log-times gives p < 0.05; withheld where a series did not settle"),
    ("verdict", "pass: verified at that batch, then timed with its outputs audited | INVALID: outputs during"),
    ("", "timing differed from the verified ones, no number | FAIL, ERROR: not timed (the reason follows)"),
]
GPU_LEGEND = [
    ("batch", "the batch size of the row, as in the table above"),
    ("median ms", "median GPU time of one call at that batch, input already on the device, synchronised after it"),
    ("energy / inference", "board energy (NVML) over the warm-up and timed calls / those calls, at that batch,"),
    ("", "sampled at the rate shown"),
    ("SM clock", "lowest-highest streaming-multiprocessor clock sampled while timing"),
    ("peak device MB", "the most device memory the path held"),
    ("clocks", "locked | not locked: the SM clock moved, timings may vary with boost | unknown: cannot tell"),
]
FOOTPRINT_LEGEND = [
    ("batch", "the batch size of the row, as in the table above"),
    ("median ms", "the median of the timing table above, beside what the same series cost"),
    ("peak MB", "the most resident memory the worker held while the series was timed, above its resident size"),
    ("", "before it built any runner (frameworks imported); its other open series of the path included"),
    ("artifact MB", "the size on disk of the artifact the series ran (-: a native path runs no artifact)"),
    ("device MB", "on a GPU, the most device memory the path held"),
    ("J / inference", "CPU package energy (RAPL) over the metered calls / those calls, other processes included"),
]
TRAIN_LEGEND = [
    ("batch", "the model's checked batch size (its golden inputs): one step trains on that many samples"),
    ("median ms", "median time of one step at that batch"),
    ("steps/s", "1000 / median ms"),
    ("samples/s", "batch x steps/s"),
    ("check", "the step was verified first: new weights = golden weights - lr x golden gradient"),
]
FIRST_LEGEND = [
    ("batch", "the model's checked batch size: the 1st and 2nd run and the 1st backward are at that batch"),
    ("import s", "seconds to start the worker and import the path's runtime (not the framework it came from)"),
    ("export s", "seconds the export took (cache: taken from the export cache, not exported this time)"),
    ("load s", "seconds to load or compile the exported artifact (or build the native model)"),
    ("1st/2nd run ms", "the first and the second inference, each timed alone"),
    ("1st backward ms", "the first gradient computation (-: the path cannot differentiate)"),
    ("peak MB", "resident memory the path added above the worker after import"),
]


def _ratio(entry: dict) -> str:
    vs = entry.get("vs_baseline") or {}
    if vs.get("self"):
        return "baseline"
    if vs.get("withheld"):
        return "withheld (a series did not settle)"
    if "ratio" not in vs:
        return "-"
    lo, hi = vs["ci95"]
    word = f"{vs['verdict']} (CI excludes 1, p {vs['p']:.2g})" if vs["significant"] else "no significant difference"
    return f"{ratio_text(vs['ratio'])} [{ratio_text(lo)}, {ratio_text(hi)}] vs {vs['baseline']}: {word}"


def _batch_rows(r: dict) -> list[tuple]:
    timing = r.get("timing")
    if not timing:  # the gate: listed with its verdict, no number
        return [(r["model"], r["path"], _label(r), "-", "-", "-", "-", "-", "-", "-", "not timed: did not pass")]
    rows = []
    # the batch sizes, then a model's other axis sizes (its verification shapes, e.g. "batch=3, sequence=8")
    for batch, e in series_of(r):
        if e.get("verdict") != "pass":
            prefix = "" if e.get("verdict") == "invalid" else "not timed: "
            rows.append(
                (
                    r["model"],
                    r["path"],
                    e.get("verdict", "error").upper(),
                    batch,
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    prefix + " ".join(str(e.get("reason", "")).split())[:90],
                )
            )
            continue
        lo, hi = e["ci95_ms"]
        spread = e.get("spread", e["cv"])
        rows.append(
            (
                r["model"],
                r["path"],
                "pass",
                batch,
                f"{e['median_ms']:.4f}",
                f"[{lo:.4f}, {hi:.4f}]",
                f"{100 * spread:.1f}%",
                "-" if e.get("p99_ms") is None else f"{e['p99_ms']:.4f}",
                str(e["runs"]),
                f"{e['throughput']:.0f}",
                _ratio(e),
            )
        )
    return rows


def footprint_rows(results: list[dict]) -> tuple[list[tuple], list[str]]:
    """Per timed series: its median, peak memory, artifact size, device memory and energy per inference; and the
    reasons, each once, why a figure could not be measured."""
    rows, why = [], []
    for r in results:
        for batch, e in series_of(r):
            if e.get("verdict") != "pass":
                continue
            memory, energy = e.get("memory") or {}, e.get("energy") or {}
            device = (e.get("gpu") or {}).get("peak_device_memory_mb")
            if not (memory or energy or "artifact_mb" in e or device is not None):
                continue  # a result written before these were measured
            for figure in (memory, energy):
                if figure.get("reason") and figure["reason"] not in why:
                    why.append(figure["reason"])
            joules = energy.get("joules_per_inference")
            rows.append(
                (
                    r["model"],
                    r["path"],
                    batch,
                    f"{e['median_ms']:.4f}",
                    megabytes(memory.get("peak_rss_mb")),
                    megabytes(e.get("artifact_mb"), ".2f"),
                    megabytes(device),
                    "-" if joules is None else f"{joules:.4g}",
                )
            )
    return rows, why


def megabytes(value, spec: str = ".0f") -> str:
    """A size in MB as a table shows it, ``-`` where unknown."""
    return "-" if value is None else format(value, spec)


def _train_rows(results: list[dict]) -> list[tuple]:
    rows = []
    for r in results:
        step = (r.get("timing") or {}).get("train_step")
        if not step:
            continue
        if step.get("verdict") != "pass":
            rows.append(
                (
                    r["model"],
                    r["path"],
                    step.get("verdict", "error").upper(),
                    _batch(r),
                    "-",
                    "-",
                    "-",
                    " ".join(str(step.get("reason", "")).split())[:90],
                )
            )
            continue
        rows.append(
            (
                r["model"],
                r["path"],
                "pass",
                _batch(r),
                f"{step['median_ms']:.3f}",
                f"{step['steps_per_s']:.1f}",
                f"{step['samples_per_s']:.0f}",
                f"worst parameter {step['verified']['worst']}",
            )
        )
    return rows


def _batch(result: dict) -> str:
    """The batch size a result was checked at (the one its training step and first result run at)."""
    return str(result.get("batch_size") or "-")


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ms(value) -> str:
    return "-" if value is None else f"{1e3 * value:.2f}"


def _first_rows(results: list[dict]) -> list[tuple]:
    rows = []
    for r in results:
        first = (r.get("timing") or {}).get("first_result")
        if not first or first.get("verdict") == "error":
            continue
        export = "cache" if first.get("export_cached") else _seconds(first.get("export_s"))
        rows.append(
            (
                r["model"],
                r["path"],
                _batch(r),
                _seconds(first["import_s"]),
                export,
                _seconds(first["load_s"]),
                _ms(first["first_inference_s"]),
                _ms(first["second_inference_s"]),
                _ms(first["first_backward_s"]),
                f"{first['path_peak_mb']:.0f}",
            )
        )
    return rows


def _gpu_rows(results: list[dict]) -> tuple[list[tuple], list[str]]:
    """GPU compute alone, energy, clocks and device memory per timed GPU batch; and the clock warnings."""
    rows, warnings = [], []
    for r in results:
        for batch, e in ((r.get("timing") or {}).get("batches") or {}).items():
            gpu = e.get("gpu")
            if e.get("verdict") != "pass" or not gpu:
                continue
            compute = gpu["compute"]
            if "median_ms" not in compute:
                rows.append((r["model"], r["path"], batch, "-", "-", "-", "-", "-", compute.get("reason", "")[:60]))
                continue
            energy, clocks = gpu.get("energy") or {}, gpu.get("clocks") or {}
            joules = energy.get("joules_per_inference")
            lo, hi = compute["ci95_ms"]
            memory = gpu.get("peak_device_memory_mb")
            rows.append(
                (
                    r["model"],
                    r["path"],
                    batch,
                    f"{compute['median_ms']:.4f}",
                    f"[{lo:.4f}, {hi:.4f}]",
                    f"{joules:.4g} J @ {energy['sampling_hz']:.0f} Hz"
                    if joules is not None and energy.get("sampling_hz")
                    else (f"{joules:.4g} J" if joules is not None else "not measurable here"),
                    f"{clocks.get('sm_mhz_min')}-{clocks.get('sm_mhz_max')} MHz" if clocks.get("sm_mhz_min") else "-",
                    "-" if memory is None else f"{memory:.0f}",
                    _LOCKED.get(clocks.get("locked"), "unknown"),
                )
            )
            if clocks.get("warning"):
                warnings.append(f"{r['model']} {r['path']} batch {batch}: {clocks['warning']}")
    return rows, warnings


def render(report: dict) -> str:
    """The benchmark block printed after the verdict table of ``run`` / ``bench``."""
    results = report["results"]
    lines = ["Timing (median of the timed runs; input ready on the host -> outputs on the host as NumPy)"]
    columns = [
        ("model", "left"),
        ("path", "left"),
        ("verdict", "left"),
        ("batch", "right"),
        ("median ms", "right"),
        ("95% CI ms", "right"),
        ("spread", "right"),
        ("p99 ms", "right"),
        ("runs", "right"),
        ("samples/s", "right"),
        ("vs baseline (ratio of medians [95% CI])", "left"),
    ]
    forward = [row for r in results if not r.get("generation") for row in _batch_rows(r)]
    if forward:
        lines += [_table(columns, forward), "", *_legend(TIMING_LEGEND)]
    else:
        lines = []
    lines += generation_rows(results)
    processes = [
        (
            r["model"],
            r["path"],
            batch,
            str(e["processes"]["n"]),
            f"{100 * e['processes']['between_processes_cv']:.1f}%",
            f"{100 * e['processes']['within_process_spread']:.1f}%",
            ", ".join(f"{m:.4g}" for m in e["processes"]["medians_ms"]),
        )
        for r in results
        for batch, e in ((r.get("timing") or {}).get("batches") or {}).items()
        if isinstance(e, dict) and e.get("processes")
    ]
    if processes:
        lines += [
            "",
            "Processes (each series pooled from fresh worker processes)",
            _table(
                [
                    ("model", "left"),
                    ("path", "left"),
                    ("batch", "right"),
                    ("processes", "right"),
                    ("between", "right"),
                    ("within", "right"),
                    ("median ms per process", "left"),
                ],
                processes,
            ),
            "",
            *_legend(
                [
                    ("between", "process-to-process variation: cv of the processes' medians"),
                    ("within", "run-to-run: the processes' median spread (interquartile range / median)"),
                ]
            ),
        ]
    gpu, clock_warnings = _gpu_rows(results)
    if gpu:
        lines += [
            "",
            (
                "GPU compute alone (input on the device, outputs left there, synchronised after each call), "
                "energy per inference over that window"
            ),
            _table(
                [
                    ("model", "left"),
                    ("path", "left"),
                    ("batch", "right"),
                    ("median ms", "right"),
                    ("95% CI ms", "right"),
                    ("energy / inference", "right"),
                    ("SM clock", "right"),
                    ("peak device MB", "right"),
                    ("clocks", "left"),
                ],
                gpu,
            ),
            "",
            *_legend(GPU_LEGEND),
        ]
    footprint, unmeasured = footprint_rows(results)
    if footprint:
        lines += [
            "",
            "Memory and energy (per timed series, beside its latency)",
            _table(
                [
                    ("model", "left"),
                    ("path", "left"),
                    ("batch", "right"),
                    ("median ms", "right"),
                    ("peak MB", "right"),
                    ("artifact MB", "right"),
                    ("device MB", "right"),
                    ("J / inference", "right"),
                ],
                footprint,
            ),
            "",
            *_legend(FOOTPRINT_LEGEND),
        ]
        lines += [f"  not measured here: {why}" for why in unmeasured]
    speed = quantized.speed_rows(results)
    if speed:
        lines += [
            "",
            "Quantized paths: speed-up over the float path they were quantized from, beside their accuracy",
            _table(quantized.SPEED_COLUMNS, speed),
            "",
            *_legend(quantized.SPEED_LEGEND),
        ]
    train = _train_rows(results)
    if train:
        lines += [
            "",
            "Training step (forward, loss, backward, SGD update; verified against the golden first)",
            _table(
                [
                    ("model", "left"),
                    ("path", "left"),
                    ("verdict", "left"),
                    ("batch", "right"),
                    ("median ms", "right"),
                    ("steps/s", "right"),
                    ("samples/s", "right"),
                    ("check", "left"),
                ],
                train,
            ),
            "",
            *_legend(TRAIN_LEGEND),
        ]
    first = _first_rows(results)
    if first:
        title = (
            "Time to first result in a fresh worker (peak MB: resident memory the path added above the "
            "worker after import)"
        )
        lines += [
            "",
            title,
            _table(
                [
                    ("model", "left"),
                    ("path", "left"),
                    ("batch", "right"),
                    ("import s", "right"),
                    ("export s", "right"),
                    ("load s", "right"),
                    ("1st run ms", "right"),
                    ("2nd run ms", "right"),
                    ("1st backward ms", "right"),
                    ("peak MB", "right"),
                ],
                first,
            ),
            "",
            *_legend(FIRST_LEGEND),
        ]
    hardware: dict[str, list[str]] = {}
    for r in results:
        if r.get("timing") and r.get("node"):
            hardware.setdefault(r["node"]["hardware"], []).append(f"{r['model']} {r['path']}")
    if len(hardware) > 1:  # cells timed on different nodes: each figure belongs to its hardware
        lines += ["", "Timed on different hardware (compared with a baseline only on the same hardware):"]
        lines += [f"  {name}: {', '.join(cells)}" for name, cells in hardware.items()]
    for warning in [*dict.fromkeys(clock_warnings), *warnings(report)]:
        lines += ["", *textwrap.wrap(f"warning: {warning}", WRAP, subsequent_indent="  ")]
    return "\n".join(lines)


def series_of(result: dict) -> list[tuple[str, dict]]:
    """(batch size or shape, entry) of every timed series of a result: its batch sizes, then its other shapes."""
    timing = result.get("timing") or {}
    return [
        (key, e)
        for key, e in [*(timing.get("batches") or {}).items(), *(timing.get("shapes") or {}).items()]
        if isinstance(e, dict)
    ]


def _series(results: list[dict]):
    """(label, entry) of every timed series that passed: batch sizes and other shapes."""
    for r in results:
        for batch, e in series_of(r):
            if e.get("verdict") == "pass":
                yield f"{r['model']} {r['path']} batch {batch}", e


def warnings(report: dict) -> list[str]:
    """What a benchmarker must read before the numbers, each said once: the host audit's findings, series voided
    or flagged by their audits, warm-ups that did not converge, and noise (one line for the machine when most
    series are noisy, else the noisy series named)."""
    found = list((report.get("host") or {}).get("warnings") or [])
    series = list(_series(report["results"]))
    for label, e in series:
        cache = (e.get("audit") or {}).get("cache") or {}
        if cache.get("flagged"):
            found.append(f"{label}: {cache['reason']}")
    cold = [label for label, e in series if e.get("warmup_converged") is False]
    if cold:
        found.append(f"warm-up did not converge (its timings may still include warm-up effects): {_few(cold)}")
    # the interquartile range over 1.349 is a robust standard deviation: compared with the cv threshold
    noisy = [(label, e.get("spread", e["cv"])) for label, e in series if e.get("spread", e["cv"]) / 1.349 > CV_WARNING]
    if series and len(noisy) > len(series) / 2:
        spreads = sorted(v for _, v in noisy)
        found.append(
            f"this machine is too noisy for the requested precision: {len(noisy)} of {len(series)} series "
            f"spread by more than {100 * 1.349 * CV_WARNING:.1f}% (median {100 * spreads[len(spreads) // 2]:.0f}%"
            "); compare medians by their intervals only, and see the host audit"
        )
    elif noisy:
        found.append(
            f"spread above {100 * 1.349 * CV_WARNING:.1f}% (compare those medians by their intervals): "
            + _few([f"{label} {100 * v:.1f}%" for label, v in noisy])
        )
    return found


def _few(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def generation_rows(results: list[dict]) -> list[str]:
    """The generation paths' timing (``parity.generation.timing``): time to first token and decode tokens per second
    with their 95% intervals, per batch size; a path that could not be timed says why."""
    rows = []
    for r in results:
        timed = (r.get("generation") or {}).get("timing")
        if not timed:
            continue
        if "batches" not in timed:
            rows.append((r["model"], r["path"], "-", "-", "-", "-", "-", timed.get("reason") or timed.get("verdict")))
            continue
        for batch, e in timed["batches"].items():
            ttft, tps = e["ttft_ms"], e["decode_tokens_per_s"]
            rows.append(
                (
                    r["model"],
                    r["path"],
                    batch,
                    f"{ttft['median']:.4g} [{ttft['low']:.4g}, {ttft['high']:.4g}]",
                    f"{tps['median']:.4g} [{tps['low']:.4g}, {tps['high']:.4g}]",
                    "-" if e.get("peak_rss_mb") is None else f"{e['peak_rss_mb']:.0f}",
                    f"{e['cache_bytes'] / 2**20:.3g}",
                    f"n {ttft['n']}",
                )
            )
    if not rows:
        return []
    columns = [
        ("model", "left"),
        ("path", "left"),
        ("batch", "right"),
        ("first token ms [95% CI]", "right"),
        ("decode tokens/s [95% CI]", "right"),
        ("peak MB", "right"),
        ("cache MiB", "right"),
        ("", "left"),
    ]
    return [
        "",
        "Generation (prefill and greedy decode with the path's own cache, on prompts of the spec's bench length)",
        _table(columns, rows),
    ]
