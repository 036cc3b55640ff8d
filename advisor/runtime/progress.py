"""What a computation of more than a few seconds is doing, told to whoever shows it.

A simulation takes seconds to minutes; the code that runs one says so with ``working("simulating plan 3/7: ...")``
around it, and the display listening (advisor.ui.status: a status line on stderr; the tune command's live trials
table) shows the open steps, outermost first. Nobody listening: nothing is shown and nothing is kept.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

Listener = Callable[[tuple[str, ...]], None]
"""Called with the steps open now, outermost first (empty: nothing is running)."""

_listeners: list[Listener] = []
_local = threading.local()


def _open() -> list[str]:
    if not hasattr(_local, "steps"):
        _local.steps = []
    return _local.steps


def _tell() -> None:
    steps = tuple(_open())
    if _listeners:
        _listeners[-1](steps)  # the latest display shows it (a live table over a status line)


@contextlib.contextmanager
def working(text: str) -> Iterator[None]:
    """Say ``text`` while the block runs."""
    steps = _open()
    steps.append(text)
    _tell()
    try:
        yield
    finally:
        steps.remove(text)
        _tell()


def busy() -> bool:
    """Whether a step is open in this thread (a caller already said what it is doing)."""
    return bool(_open())


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Show the steps with ``listener`` while the block runs (the latest listener shows them alone)."""
    add_listener(listener)
    try:
        yield
    finally:
        remove_listener(listener)


def add_listener(listener: Listener) -> None:
    _listeners.append(listener)


def listeners() -> tuple[Listener, ...]:
    return tuple(_listeners)


def remove_listener(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)
