"""The status line on stderr: what a long computation is doing (advisor.runtime.progress), while it runs.

On a terminal, a rich status spinner with the open steps ("simulating plan 3/7: ..."), cleared when they end; on
anything else (a pipe, a log file), each step as one plain line when it starts. stdout is left alone (a --json
answer stays one object).
"""

from __future__ import annotations

import sys

from advisor.runtime import progress


class StatusLine:
    """A progress listener that shows the open steps on stderr."""

    def __init__(self, stream=None):
        self._stream = stream
        self._status = None
        self._shown: tuple[str, ...] = ()

    @property
    def stream(self):
        """The stream given, else stderr as it is now (an app that captures stderr while it runs gets the lines)."""
        return self._stream or sys.stderr

    def __call__(self, steps: tuple[str, ...]) -> None:
        if self._status is None and not bool(getattr(self.stream, "isatty", lambda: False)()):
            if len(steps) > len(self._shown):
                print(" · ".join(steps), file=self.stream, flush=True)
            self._shown = steps
            return
        if not steps:
            if self._status is not None:
                self._status.stop()
                self._status = None
            self._shown = ()
            return
        from rich.console import Console
        from rich.markup import escape

        if self._status is None:
            self._status = Console(file=self.stream).status(escape(" · ".join(steps)))
            self._status.start()
        else:
            self._status.update(escape(" · ".join(steps)))
        self._shown = steps


def show_status() -> StatusLine:
    """Show long computations on stderr from now on (the commands call it once, before any work)."""
    for old in [x for x in progress.listeners() if isinstance(x, StatusLine)]:
        progress.remove_listener(old)  # one status line (a command run again in one process replaces its own)
    line = StatusLine()
    progress.add_listener(line)
    return line
