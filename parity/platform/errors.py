"""Typed errors. The CLI turns each into one clear line and an exit code."""

from __future__ import annotations

import re
from collections.abc import Iterable


def one_line(text: object, limit: int) -> str:
    """``text`` with its terminal colour codes removed (a library's coloured message) and its whitespace collapsed
    to single spaces, cut to ``limit`` characters."""
    collapsed = " ".join(re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(text)).split())
    return collapsed if len(collapsed) <= limit else collapsed[: limit - 3] + "..."


class ParityError(Exception):
    """Base class: an error the user can act on (exit code 2 at the CLI)."""


class GoldenError(ParityError):
    """Golden data missing, malformed or corrupted (checksum mismatch)."""


class SpecError(ParityError):
    """A model spec that cannot be loaded or is inconsistent."""


class UsageError(ParityError):
    """Unknown model, path pattern matching nothing, bad option."""


class ExportError(ParityError):
    """An exporter or converter failed; the message is the converter's own reason."""


class WeightsMismatch(ParityError):
    """Weights whose names or shapes do not match a framework's definition."""

    def __init__(
        self,
        framework: str,
        missing: Iterable[str] = (),
        unexpected: Iterable[str] = (),
        misshaped: Iterable[tuple[str, object, object]] = (),
    ):
        self.missing, self.unexpected, self.misshaped = list(missing), list(unexpected), list(misshaped)
        parts: list[str] = []
        if self.missing:
            parts.append(f"missing {self.missing}")
        if self.unexpected:
            parts.append(f"unexpected {self.unexpected}")
        if self.misshaped:
            parts.append("mis-shaped " + ", ".join(f"{n} (weights {w}, {framework} {f})" for n, w, f in self.misshaped))
        what = "the model spec" if framework == "spec" else f"the {framework} definition"
        super().__init__(f"weights do not match {what}: " + "; ".join(parts))


class NotDifferentiable(ParityError):
    """Gradients were asked of a path that cannot differentiate."""


class Unavailable(ParityError):
    """A path that cannot run here: no such device, a CPU-only build, a precision the runtime cannot do.
    Becomes a ``skip`` with the message as its reason, never an error."""


class NotEnoughMemory(ParityError):
    """A step whose estimated peak memory exceeds what is available: refused before it starts (exit code 2); the
    message says what it needs, what there is and the options."""


class TaskFailed(Exception):
    """A task raised, crashed its worker, or ran past its timeout; the message is the reason.

    ``kind`` says which: ``raised`` (the task's own exception: deterministic, may be cached), ``golden`` (golden
    arrays that do not match their verified manifest: the model's input error, never cached),
    ``startup`` (the worker's framework failed to import), ``died``, ``timeout`` or ``oom`` (parity killed it past the
    memory available, or the kernel did).
    """

    def __init__(self, message: str, kind: str = "raised", log: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.log = log  # the worker's log, with the task's traceback
