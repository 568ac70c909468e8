"""A value computed in a thread while the caller goes on (the environment manifest while workers start)."""

from __future__ import annotations

import threading


class Background:
    """``fn()`` in a thread, started now; ``result()`` waits for it (and raises what it raised)."""

    def __init__(self, fn):
        self._value, self._error = None, None

        def target():
            try:
                self._value = fn()
            except BaseException as error:  # noqa: BLE001 - handed to the caller of result()
                self._error = error

        self._thread = threading.Thread(target=target, name="parity-environment", daemon=True)
        self._thread.start()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
