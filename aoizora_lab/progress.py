"""Progress lines from long stages (compile sweeps, plan stages), for a person waiting.

:func:`note` writes one line to ``stderr``, prefixed with :data:`MARKER`, when progress is on:
``$AOIZORA_LAB_PROGRESS`` = ``1`` (on) or ``0`` (off); unset: on inside a Jupyter kernel (a
notebook cell that compiles shows what it is doing), off elsewhere (scripts and tests stay
quiet; the command line has its own bars). The report runner (:mod:`aoizora_lab.reports`)
turns it on for its kernels, forwards the marked lines to its terminal and leaves them out of
the published pages. Example, a cold ``03_compile``::

    [aoizora-lab] compile 2 of 6: cfg2-uly4 (default flags) ok in 41 s; about 1.4 min left
"""

from __future__ import annotations

import os
import sys
import time

PROGRESS_ENV = "AOIZORA_LAB_PROGRESS"
"""``1``: progress lines on; ``0``: off; unset: on only inside a Jupyter kernel."""

MARKER = "[aoizora-lab] "
"""Start of every progress line (the report runner recognises them by it)."""


def enabled() -> bool:
    """Whether :func:`note` writes (module docstring)."""
    setting = os.environ.get(PROGRESS_ENV)
    if setting is not None:
        return setting.strip() not in ("", "0")
    return "ipykernel" in sys.modules


def duration(seconds: float) -> str:
    """``41 s``, or ``1.4 min`` from 90 s on: a wait as a person reads it."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def note(message: str) -> None:
    """One progress line to ``stderr`` when :func:`enabled`."""
    if enabled():
        print(MARKER + message, file=sys.stderr, flush=True)


class Ticker:
    """Progress of a loop, at most one :func:`note` every ``seconds`` (a warm loop that ends
    in a second says nothing; a cold one says how far it is)."""

    def __init__(self, seconds: float = 5.0) -> None:
        self.seconds = seconds
        self.last = time.monotonic()

    def note(self, message: str) -> None:
        """:func:`note` ``message`` if ``seconds`` have passed since the last one."""
        now = time.monotonic()
        if now - self.last >= self.seconds:
            self.last = now
            note(message)
