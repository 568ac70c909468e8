"""Progress a person can follow while a run works, on stderr.

On a terminal: one live line that ticks every second, ``step k of n``, the step's message, the time spent
and an estimate of the time left (once a step has finished). Piped or in CI: one plain line per finished
step, with its duration, so a long run is never minutes of silence. ``off``: nothing (``--json -``).
"""

from __future__ import annotations

import contextlib
import time

import click

from parity.report.escape import visible


def duration(seconds: float) -> str:
    """``4 s``, ``2 min 05 s``: whole seconds, for a line that ticks."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest:02d} s"


class Progress:
    """The ``progress`` callback of the orchestrator: ``progress(message)`` or ``progress(message, step=k,
    steps=n)`` as each step starts. ``mode`` is ``live`` (a terminal), ``lines`` (piped) or ``off``.

    Numbered steps form a series (the exports of a run, its checks): ``step k of n``, and once one of them has
    finished, the time the series has left. An unnumbered step (a diagnosis, a timing) shows its time only.
    """

    def __init__(self, mode: str, clock=time.monotonic, echo=None):
        self.mode = mode
        self.clock = clock
        self.echo = echo or (lambda line: click.echo(line, err=True))
        self.live = None
        self.started: float | None = None
        self.step_started: float | None = None
        self.message: str | None = None  # the step under way (None: between steps)
        self.step: int | None = None  # its number and the series' count; None: unnumbered
        self.steps: int | None = None
        self.series: tuple[int | None, int, float] = (
            None,
            0,
            0.0,
        )  # steps in the series, the last step number seen, seconds its finished steps took
        self.finished = 0  # finished steps of the series

    def __call__(self, message: str, step: int | None = None, steps: int | None = None) -> None:
        self.finish_step()
        if step is not None:
            count, last, _ = self.series
            if steps != count or step <= last:  # a new series
                self.series, self.finished = (steps, step, 0.0), 0
            self.series = (steps, step, self.series[2])
        self.step, self.steps = step, steps if step is not None else None
        self.message, self.step_started = visible(message), self.clock()

    def finish_step(self) -> None:
        """Close the step under way (a plain line says it is done, and how long it took)."""
        if self.message is None:
            return
        spent = self.clock() - self.step_started
        if self.step is not None:
            count, last, seconds = self.series
            self.series, self.finished = (count, last, seconds + spent), self.finished + 1
        if self.mode == "lines":
            counter = f"{self._counter()}, " if self.step is not None else ""
            self.echo(f"  {self.message}  ({counter}{spent:.1f} s)")
        self.message = None

    def _counter(self) -> str:
        return f"step {self.step} of {self.steps}" if self.steps else f"step {self.step}"

    def left_s(self) -> float | None:
        """Seconds the series has left: the mean of its finished steps times the steps not finished, less the
        time of this one so far (never below the steps not yet started); None while none has finished."""
        count, _, seconds = self.series
        if self.step is None or not count or self.finished < 1:
            return None
        mean = seconds / self.finished
        remaining = max(count - self.step + 1, 0)  # this one and those after it
        so_far = self.clock() - self.step_started
        return max(mean * remaining - so_far, mean * max(remaining - 1, 0))

    def line(self) -> str:
        """The live line as it reads now: counts and times first, so a narrow terminal cuts the message, not them."""
        now = self.clock()
        if self.message is None:
            return f"[{duration(now - self.started)} in all] working" if self.started is not None else "starting"
        parts = [self._counter()] if self.step is not None else []
        parts.append(f"{duration(now - self.started)} in all")
        left = self.left_s()
        if left is not None:
            parts.append(f"about {duration(left)} left")
        return f"[{' | '.join(parts)}] {self.message}  (this step: {duration(now - self.step_started)})"

    def __rich__(self):
        from rich.text import Text

        # Text: a message with "[...]" is not markup; one line, never wrapped
        return Text(self.line(), no_wrap=True, overflow="ellipsis")

    def __enter__(self):
        self.started = self.clock()
        if self.mode == "live":
            from rich.console import Console
            from rich.live import Live
            from rich.spinner import Spinner

            # stdout is left alone: the tables go there (and perhaps to a file) while the line lives on stderr
            self.live = Live(
                Spinner("dots", text=self),
                console=Console(stderr=True),
                refresh_per_second=4,
                transient=True,
                redirect_stdout=False,
            )
            self.live.start()
        return self

    def __exit__(self, kind, *exc):
        if kind is None:
            self.close()
        elif self.live is not None:
            self.live.stop()
            self.live = None

    def close(self) -> None:
        """The run is over: close the step under way and take the live line away (for good)."""
        self.finish_step()
        if self.live is not None:
            self.live.stop()
            self.live = None

    def note(self, message: str) -> None:
        """A one-line note on stderr; on a terminal, printed above the live line."""
        message = visible(message)
        if self.live is not None:
            from rich.text import Text

            self.live.console.print(Text(message), soft_wrap=True)
        else:
            click.echo(message, err=True)

    @contextlib.contextmanager
    def pause(self):
        """Print something in the middle of a run: the step under way is closed and the live line steps aside."""
        self.finish_step()
        if self.live is not None:
            self.live.stop()
        try:
            yield
        finally:
            if self.live is not None:
                self.live.start()
