"""``parity compare A.json B.json``: what changed between two result files.

In order: the environment differences (and warnings where threads, precision, device or batch
size differ), the verdict changes per (model, path), then the timing ratios B/A per
(model, path, batch) timed in both, each ratio of medians with its 95 % CI and p from
``parity.bench.stats.compare_series`` on the raw samples (an entry without them shows the ratio only,
untested). Nothing is guessed: files sharing no model are not compared.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TypeGuard

from parity.platform.errors import UsageError, one_line
from parity.report.terminal import _label, _table
from parity.report.timing_table import megabytes

SCHEMA = "parity.result/2"
OLDER = ("parity.result/1",)  # no raw samples: nothing to test a difference with
MAX_BYTES = 256 * 1024 * 1024  # a result file larger than this is refused unread
_ABSENT = object()
NO_SAMPLES = "no samples: significance not tested"
NO_DIFFERENCE = "no significant difference"


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def load(path) -> dict:
    """A result file, read strictly (size cap, no NaN/Infinity) and checked to be one this parity reads.

    Raises ``UsageError`` with a one-line message naming the file otherwise.
    """
    name = str(path)

    def refuse(why: str):
        return UsageError(one_line(f"{name}: {why}", 300))

    try:
        with open(Path(path), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as error:
        raise refuse(f"cannot read ({error.strerror or error})") from None
    if len(data) > MAX_BYTES:
        raise refuse(f"larger than {MAX_BYTES // 2**20} MiB; not a parity result")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise refuse(f"not a parity result (not valid JSON: {error})") from None
    if not isinstance(doc, dict):
        raise refuse(f"not a parity result (a JSON {type(doc).__name__}, not an object)")
    if "schema" not in doc:
        raise refuse("not a parity result (no 'schema' field)")
    if doc["schema"] in OLDER:
        raise refuse(
            f"result schema {doc['schema']!r} is older than this parity reads ({SCHEMA}, which keeps "
            f"the raw samples): run it again with this parity"
        )
    if doc["schema"] != SCHEMA:
        raise refuse(f"result schema {doc['schema']!r} is not one this parity reads ({SCHEMA})")
    if "results" not in doc:
        raise refuse("not a parity result (no 'results' field)")
    if not isinstance(doc["results"], list):
        raise refuse("not a parity result ('results' is not a list)")
    for i, result in enumerate(doc["results"]):
        if not isinstance(result, dict) or not all(isinstance(result.get(k), str) for k in ("model", "path")):
            raise refuse(f"not a parity result (results[{i}] has no 'model' and 'path')")
        problem = _timing_problem(result)
        if problem:
            raise refuse(f"results[{i}] ({result['model']} {result['path']}): {problem}")
    if not isinstance(doc.get("env", {}), dict):
        raise refuse("not a parity result ('env' is not an object)")
    return doc


def _duration(v: object) -> TypeGuard[float]:
    """Whether ``v`` is a timing in milliseconds: a positive finite number."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _shown(v) -> str:
    """A JSON value as a message shows it: a number as written, anything else by its type."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(v)
    return "null" if v is None else f"a JSON {type(v).__name__}"


def _timing_problem(result: dict) -> str | None:
    """What is wrong with a result's timing (every median and raw sample a positive finite ms), or None."""
    timing = result.get("timing")
    batches = timing.get("batches") if isinstance(timing, dict) else None
    for batch, entry in batches.items() if isinstance(batches, dict) else ():
        if not isinstance(entry, dict):
            continue
        where = f"timing.batches.{batch}"
        median, samples = entry.get("median_ms"), entry.get("samples_ms")
        if median is not None and not _duration(median):
            return f"{where}.median_ms is {_shown(median)}, not a positive finite number of milliseconds"
        if samples is not None and not isinstance(samples, list):
            return f"{where}.samples_ms is {_shown(samples)}, not a list"
        for j, sample in enumerate(samples or ()):
            if not _duration(sample):
                return f"{where}.samples_ms[{j}] is {_shown(sample)}, not a positive finite number of milliseconds"
    return None


# --- formatting helpers ---------------------------------------------------------------------------


def _value(v) -> str:
    if v is _ABSENT:
        return "(absent)"
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True, separators=(", ", ": "))


def _env_diff(a, b, prefix: str = "") -> list[str]:
    """``key.sub: A -> B`` for every differing leaf; nested objects are flattened with dots."""
    if isinstance(a, dict) and isinstance(b, dict):
        lines = []
        for key in list(a) + [k for k in b if k not in a]:
            lines += _env_diff(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{prefix}{key}.")
        return lines
    if a == b:
        return []
    return [f"{prefix[:-1]}: {_value(a)} -> {_value(b)}"]


def _names(models) -> str:
    models = list(models)
    if not models:
        return "no models"
    return models[0] if len(models) == 1 else ", ".join(models[:-1]) + " and " + models[-1]


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _ms(v) -> str:
    x = _number(v)
    return "-" if x is None else f"{x:.4g}"


def _verdict(result: dict | None) -> str:
    if result is None:
        return "(absent)"
    return _label(result) if result.get("verdict") is not None else "-"


def _by_key(doc: dict) -> dict[tuple[str, str], dict]:
    return {(r["model"], r["path"]): r for r in doc["results"]}


def _batches(result: dict) -> dict[str, dict]:
    """Timing per batch size (``timing.batches``), verified and timed entries only."""
    batches = (result.get("timing") or {}).get("batches") if isinstance(result.get("timing"), dict) else None
    if not isinstance(batches, dict):
        return {}
    return {str(k): v for k, v in batches.items() if isinstance(v, dict) and "median_ms" in v}


def _samples(entry: dict) -> list[float] | None:
    samples = entry.get("samples_ms")
    if not isinstance(samples, list) or len(samples) < 2:
        return None
    values = [_number(s) for s in samples]
    positive = [v for v in values if v is not None and v > 0]
    return positive if len(positive) == len(values) else None


def _ratio(log_ratio: float) -> str:
    """A ratio given by its natural log: ``1.234``, or ``1.23e+600`` where fixed point would read 0.000 or
    the ratio exceeds the float range."""
    if math.log(1e-3) <= log_ratio < math.log(1e6):
        return f"{math.exp(log_ratio):.3f}"
    exponent = math.floor(log_ratio / math.log(10))
    mantissa = math.exp(log_ratio - exponent * math.log(10))
    if mantissa >= 9.995:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{mantissa:.2f}e{exponent:+d}"


def _p(p) -> str:
    x = _number(p)
    return "-" if x is None else f"{x:.2g}"


def _batch_order(key: str):
    return (0, int(key), key) if key.isdigit() else (1, 0, key)


# --- the report -----------------------------------------------------------------------------------


def _environment(a: dict, b: dict, common: list[tuple[str, str]], ra: dict, rb: dict) -> list[str]:
    env_a, env_b = a.get("env") or {}, b.get("env") or {}
    diffs = _env_diff(env_a, env_b)
    lines = ["Environment (A -> B)"] + ([f"  {d}" for d in diffs] or ["  same environment"])
    warnings = []
    threads_a, threads_b = env_a.get("threads", _ABSENT), env_b.get("threads", _ABSENT)
    if threads_a != threads_b:
        warnings.append(f"threads differ: {_value(threads_a)} -> {_value(threads_b)}; timings compared anyway")
    for key in common:
        x, y = ra[key], rb[key]
        what = [
            f"{field} {_value(x.get(field, _ABSENT))} -> {_value(y.get(field, _ABSENT))}"
            for field in ("precision", "device")
            if x.get(field, _ABSENT) != y.get(field, _ABSENT)
        ]
        if "fp32" in (x.get("precision"), y.get("precision")) and x.get("precision") != y.get("precision"):
            what.append("a reduced-precision path against an fp32 one: the difference includes the precision itself")
        bx, by = _batches(x), _batches(y)
        if bx and by and set(bx) != set(by):
            what.append(
                f"batch size {', '.join(sorted(bx, key=_batch_order))} -> {', '.join(sorted(by, key=_batch_order))}"
            )
        if what:
            warnings.append(f"{key[0]} {key[1]}: {'; '.join(what)}; compared anyway")
    return lines + [f"warning: {w}" for w in warnings]


def _verdicts(order: list[tuple[str, str]], ra: dict, rb: dict, common: list) -> list[str]:
    rows = []
    for key in order:
        x, y = ra.get(key), rb.get(key)
        if x is None:
            rows.append((*key, f"new in B ({_verdict(y)})"))
        elif y is None:
            rows.append((*key, f"missing in B (was {_verdict(x)})"))
        elif _verdict(x) != _verdict(y):
            rows.append((*key, f"{_verdict(x)} -> {_verdict(y)}"))
    lines = ["Verdicts (A -> B)"]
    if not rows:
        return lines + [f"  no verdict changes ({len(common)} paths in both)"]
    changed = sum(1 for r in rows if " -> " in r[2])
    table = _table([("model", "left"), ("path", "left"), ("verdict", "left")], rows)
    return lines + [table, f"  {len(common) - changed} of {len(common)} paths in both unchanged"]


def _tested(sa: list[float], sb: list[float]) -> tuple[str, str, str, str]:
    """B/A, its 95 % CI, p and the verdict from ``parity.bench.stats.compare_series_log`` (in log space: samples
    of 1e-300 and 1e300 ms give a ratio past the float range, shown in powers of ten)."""
    # imported here: only a comparison with samples needs it
    from parity.bench.stats import compare_series_log

    try:
        stats = compare_series_log(sb, sa)
    except ValueError as error:
        return "-", "-", "-", one_line(f"not tested: {error}", 80)
    lo, hi = stats["log_ci95"]
    verdict = NO_DIFFERENCE if lo <= 0 <= hi else stats["verdict"]
    return _ratio(stats["log_ratio"]), f"[{_ratio(lo)}, {_ratio(hi)}]", _p(stats["p"]), verdict


def _sample_median(side: str, key, batch: str, median, samples: list[float], notes: list[str]) -> float:
    """The median of ``samples``, with a note where the document's own median says otherwise."""
    from parity.bench.stats import median as median_of

    found = median_of(samples)
    if median is not None and not math.isclose(median, found, rel_tol=1e-9):
        notes.append(
            f"  note: {side} {key[0]} {key[1]} batch {batch}: its median_ms {_ms(median)} is not its samples' "
            f"median ({_ms(found)}), which is shown and compared"
        )
    return found


def _timings(common: list[tuple[str, str]], ra: dict, rb: dict) -> list[str]:
    rows: list[tuple] = []
    notes: list[str] = []
    for key in common:
        bx, by = _batches(ra[key]), _batches(rb[key])
        for batch in sorted(set(bx) & set(by), key=_batch_order):
            ea, eb = bx[batch], by[batch]
            ma, mb = _number(ea.get("median_ms")), _number(eb.get("median_ms"))
            sa, sb = _samples(ea), _samples(eb)
            ratio, ci, p, verdict = _tested(sa, sb) if sa and sb else ("-", "-", "-", NO_SAMPLES)
            if ratio != "-" and sa and sb:  # the ratio is of the samples' medians: those are the medians shown
                ma, mb = (
                    _sample_median(side, key, batch, median, samples, notes)
                    for side, median, samples in (("A", ma, sa), ("B", mb, sb))
                )
            elif _duration(ma) and _duration(mb):
                ratio = _ratio(math.log(mb) - math.log(ma))
            rows.append((*key, batch, _ms(ma), _ms(mb), ratio, ci, p, verdict))
    lines = ["Timing (B/A per batch)"]
    if not rows:
        return lines + ["  no path timed in both"]
    columns = [
        ("model", "left"),
        ("path", "left"),
        ("batch", "right"),
        ("A median ms", "right"),
        ("B median ms", "right"),
        ("B/A", "right"),
        ("95% CI", "left"),
        ("p", "right"),
        ("verdict", "left"),
    ]
    legend = [
        "  B/A: ratio of the medians (above 1: B is slower); 95% CI of that ratio and p (Welch's t-test on",
        f"  log-times) from the raw samples; a CI containing 1 reads '{NO_DIFFERENCE}'",
    ]
    return lines + [_table(columns, rows)] + legend + notes


def _memory(common: list[tuple[str, str]], ra: dict, rb: dict) -> list[str]:
    """Peak memory and artifact size B/A per batch, with a change named as ``footprint.memory_change`` names it."""
    from parity.bench.footprint import MEMORY_CHANGE, MEMORY_FLOOR_MB, memory_change

    rows = []
    for key in common:
        bx, by = _batches(ra[key]), _batches(rb[key])
        for batch in sorted(set(bx) & set(by), key=_batch_order):
            ea, eb = bx[batch], by[batch]
            pa, pb = (_number((e.get("memory") or {}).get("peak_rss_mb")) for e in (ea, eb))
            sa, sb = (_number(e.get("artifact_mb")) for e in (ea, eb))
            if pa is None and pb is None and sa is None and sb is None:
                continue
            ratio = "-" if not pa or pb is None else f"{pb / pa:.3f}"
            rows.append(
                (
                    *key,
                    batch,
                    megabytes(pa),
                    megabytes(pb),
                    ratio,
                    megabytes(sa, ".2f"),
                    megabytes(sb, ".2f"),
                    memory_change(pa, pb) or ("-" if pa is None or pb is None else "no change"),
                )
            )
    if not rows:
        return []
    columns = [
        ("model", "left"),
        ("path", "left"),
        ("batch", "right"),
        ("A peak MB", "right"),
        ("B peak MB", "right"),
        ("B/A", "right"),
        ("A artifact MB", "right"),
        ("B artifact MB", "right"),
        ("change", "left"),
    ]
    legend = [
        (
            f"  peak MB: resident memory above the worker's idle size while timed; a change is one past both "
            f"{100 * MEMORY_CHANGE:.0f}% and {MEMORY_FLOOR_MB:.0f} MB"
        )
    ]
    return ["", "Memory (B/A per batch)", _table(columns, rows)] + legend


def render(a: dict, b: dict) -> tuple[str, int]:
    """The comparison of result ``a`` (A, the baseline) with ``b`` (B) as text, and the exit code (0)."""
    ra, rb = _by_key(a), _by_key(b)
    models_a = list(dict.fromkeys(m for m, _ in ra))
    models_b = list(dict.fromkeys(m for m, _ in rb))
    shared = set(models_a) & set(models_b)
    order = [k for k in ra if k[0] in shared] + [k for k in rb if k[0] in shared and k not in ra]
    common = [k for k in ra if k in rb]
    lines = _environment(a, b, common, ra, rb)
    if not shared:
        lines += ["", f"different models: A has {_names(models_a)}, B has {_names(models_b)}; nothing to compare"]
        return "\n".join(lines), 0
    lines += [""] + _verdicts(order, ra, rb, common)
    only_a, only_b = [m for m in models_a if m not in shared], [m for m in models_b if m not in shared]
    if only_a:
        lines.append(f"  models only in A (not compared): {_names(only_a)}")
    if only_b:
        lines.append(f"  models only in B (not compared): {_names(only_b)}")
    lines += [""] + _timings(common, ra, rb) + _memory(common, ra, rb)
    return "\n".join(lines), 0
