"""A tap read from an exported graph is trusted only when its mapping holds: on a path whose outputs pass, a tap
that departs from the golden but holds exactly the golden's values in another order was read in the wrong layout
(NHWC as NCHW) or from the tensor before a transpose. Its axes are put back in order where one permutation of them
agrees with the golden; otherwise the tap is unobservable, never a divergence (NumPy only)."""

from __future__ import annotations

import itertools

import numpy as np

from parity.check.closeness import error_stats

MAX_RANK = 5  # permutations of at most 5 axes (120) are tried


def _ok(value, golden, tol) -> bool:
    return bool(error_stats(value, golden, tol).get("ok"))


def _permuted(value: np.ndarray, golden: np.ndarray, tol) -> tuple[int, ...] | None:
    """The axis order (other than the identity) that makes ``value`` agree with ``golden``, or None."""
    if value.ndim > MAX_RANK:
        return None
    for order in itertools.permutations(range(value.ndim)):
        if (
            order != tuple(range(value.ndim))
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
