"""Progress lines for the slow loops inside one round (a one-shot method's round can run for an hour).

:class:`Ticker` logs ``"<what>: i/n (t s)"`` after item ``i`` of ``n`` once ``every_s`` seconds passed since the
loop began or since its last line, so a fast loop stays silent and a slow one shows where it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Ticker:
    """Call :meth:`tick` after each of the loop's ``total`` items; ``clock`` returns seconds (default
    :func:`time.monotonic`)."""

    def __init__(self, what: str, total: int, every_s: float = 30.0,
                 clock: Callable[[], float] | None = None) -> None:
        self.what, self.total, self.every_s = what, total, every_s
        self.clock = clock or time.monotonic
        self.start = self.last = self.clock()
        self.done = 0

    def tick(self) -> None:
        """One more item done: log if ``every_s`` seconds passed since the last line (or the start)."""
        self.done += 1
        now = self.clock()
        if now - self.last >= self.every_s:
            log.info("%s: %d/%d (%.0f s)", self.what, self.done, self.total, now - self.start)
            self.last = now
