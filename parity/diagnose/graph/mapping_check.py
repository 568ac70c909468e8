"""A tap read from an exported graph is trusted only when its mapping holds: on a path whose outputs pass, a tap
that departs from the golden but holds exactly the golden's values in another order was read in the wrong layout
(NHWC as NCHW) or from the tensor before a transpose. Its axes are put back in order where one permutation of them
agrees with the golden; otherwise the tap is unobservable, never a divergence (NumPy only)."""

from __future__ import annotations

import itertools

import numpy as np

from parity.check.closeness import error_stats
from parity.diagnose.causes import drift

MAX_RANK = 5  # permutations of at most 5 axes (120) are tried


def _ok(value, golden, tol) -> bool:
    return bool(error_stats(value, golden, tol).get("ok"))


def _permuted(value: np.ndarray, golden: np.ndarray, tol, identity: bool = False) -> tuple[int, ...] | None:
    """The axis order (other than the identity, unless ``identity``) that makes ``value`` agree with ``golden``,
    or None."""
    if value.ndim > MAX_RANK or value.ndim != golden.ndim:
        return None
    for order in itertools.permutations(range(value.ndim)):
        if (
            (identity or order != tuple(range(value.ndim)))
            and tuple(value.shape[i] for i in order) == golden.shape
            and _ok(np.transpose(value, order), golden, tol)
        ):
            return order
    return None


def verify(
    taps: dict[str, np.ndarray],
    golden: dict[str, np.ndarray],
    located: dict[str, dict],
    tolerance_for,
    outputs_pass: bool,
) -> dict[str, np.ndarray]:
    """``taps`` with each wrongly ordered read put right, or removed (its ``located`` entry then says why).

    Only on a path whose outputs pass: there a departing tap whose sorted values agree with the golden's is a
    mapping error, not drift. On a failing path a permutation may be the fault itself (a flatten order) and
    stays a divergence."""
    if not outputs_pass:
        return taps
    checked = dict(taps)
    for tap, value in taps.items():
        reference = golden.get(tap)
        value = np.asarray(value, np.float64)
        if reference is None or value.shape != reference.shape or _ok(value, reference, tolerance_for(tap)):
            continue
        tol = tolerance_for(tap)
        if not _ok(np.sort(value, axis=None), np.sort(np.asarray(reference, np.float64), axis=None), tol):
            continue  # other values, not other order: drift that the outputs do not show
        order = _permuted(value, reference, tol)
        where = located.setdefault(tap, {})
        tensor = where.get("tensor")
        if order is not None:
            checked[tap] = np.transpose(value, order)
            where["reason"] = (
                f"read in another axis order: tensor {tensor!r} holds the tap with axes {order} "
                f"(put back in order by value on a passing path)"
            )
        else:
            del checked[tap]
            where.update(
                found="unobservable",
                reason=f"tensor {tensor!r} holds the tap's values in another order that no axis "
                f"permutation undoes (a reshape after a transpose): the mapping is not trusted",
            )
    return checked


def settle(value: np.ndarray, where: dict, golden: np.ndarray, tol) -> np.ndarray:
    """A tap read from a graph in the golden's order (``onnx_taps.to_canonical``), once its mapping is proven.

    A tap whose axis order neither its shape nor the graph's structure proves (``where["unproven"]``) is proven by
    value: the order that agrees with the golden (its guessed one first, then every axis permutation that fits the
    golden's shape). Where none agrees the tap is not compared: ``ValueError`` with the reason (a departure there
    cannot be told from a misread)."""
    from parity.diagnose.graph.onnx_taps import to_canonical

    canonical = to_canonical(value, where, golden.shape)
    if not where.get("unproven"):
        return canonical
    if _ok(canonical, golden, tol):
        where["reason"] = f"{where.get('reason') or 'its axis order'}; proven by value (agrees with the golden)"
        return canonical
    order = _permuted(np.asarray(value), np.asarray(golden), tol, identity=True)
    if order is not None:
        where["order"] = list(order)
        where["reason"] = f"axes {order} proven by value (the only order that agrees with the golden)"
        return np.transpose(np.asarray(value), order)
    raise ValueError(
        f"tensor {where.get('tensor')!r}: {where.get('reason') or 'its axis order is not proven'}, and no order of its "
        f"axes agrees with the golden: whether it departs or is misread cannot be told, so it is not compared"
    )


# a graph-read tap this many times further over tolerance than the outputs computed from it is not believed
CONTRADICTION = 100.0
GRAPH_READ = ("name", "metadata", "value")


def feeds_outputs(graph, tensor: str | None) -> bool:
    """Whether a graph output is computed from ``tensor`` (``onnx_graph._Graph``)."""
    if not tensor:
        return False
    seen, pending = {tensor}, [tensor]
    while pending:
        name = pending.pop()
        if name in graph.graph_outputs:
            return True
        for index in graph.consumers.get(name, ()):
            for out in graph.nodes[index].output:
                if out and out not in seen:
                    seen.add(out)
                    pending.append(out)
    return False


def output_units(stats: dict) -> float | None:
    """The outputs' worst error in tolerance units (``closeness.compare_named`` stats), None where there are none.
    An output that fails without a finite measure of it (NaN or Inf elements, another infinity than the golden's,
    another shape) counts as infinitely off: it contradicts no tap that it is computed from."""

    def units(s: dict) -> float:
        measured = s.get("tol_units", 0.0 if s.get("ok") else np.inf)
        return np.inf if not s.get("ok") and measured <= 1.0 else measured

    return max((units(s) for s in stats.values()), default=None)


def withdraw_contradicted(rows: list[dict], located: dict, output_units: float | None) -> list[str]:
    """Withdraw the divergence of each graph-read tap that its own downstream output contradicts: the outputs are
    computed from it (``located[tap]["feeds_outputs"]``) yet are ``CONTRADICTION`` times closer to the golden (in
    tolerance units, the outputs' counted as at least 1). Such a tap was misread (another tensor, another layout),
    not computed wrong; its row keeps the statistics under ``withdrawn`` and says why. Returns the withdrawn taps."""
    if output_units is None or not np.isfinite(output_units):
        return []
    withdrawn = []
    for row in rows:
        stats, where = row["stats"], located.get(row["tap"], {})
        if stats is None or stats.get("ok") or row["found"] not in GRAPH_READ or not where.get("feeds_outputs"):
            continue
        units = stats.get("tol_units", np.inf)
        if units > CONTRADICTION * max(output_units, 1.0):
            row.update(
                found="withdrawn",
                stats=None,
                growth=None,
                withdrawn=stats,
                reason=f"read {units:.3g}x the tolerance off, but the outputs computed from it are "
                f"{output_units:.3g}x: its own downstream contradicts it, so the read is not trusted (withdrawn)",
            )
            withdrawn.append(row["tap"])
    if withdrawn:
        drift.set_growth(rows)  # growth is relative to the previous compared tap
    return withdrawn
