"""Errors a user can cause. Each names the flag or key, the rule, and the value given.

The CLI prints these as one line and exits with code 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class AdvisorInputError(ValueError):
    """Bad input: a flag, a key of a config file, or a file the user handed in."""

    def __init__(self, where: str, message: str, value: object = None, *, show_value: bool = True):
        self.where = where
        self.rule = message
        self.value = value
        text = f"{where}: {message}"
        if show_value:
            text += f" (got {value!r})"
        super().__init__(text)


class ConfigErrors(AdvisorInputError):
    """Several input errors found at once, reported together (one per line after the first)."""

    def __init__(self, errors: list[AdvisorInputError]):
        self.errors = errors
        head = f"{len(errors)} error(s) in the configuration"
        ValueError.__init__(self, head + ":\n" + "\n".join(f"  - {e}" for e in errors))
        self.where, self.rule, self.value = "config", head, None


def writable_folder(path: str | os.PathLike) -> None:
    """Make ``path`` (and its parents) and check that it can be written, before any work whose result it would hold:
    an OSError (EACCES, naming the folder) otherwise, which the CLI turns into one line naming the flag."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK):
        raise OSError(errno.EACCES, "Permission denied", str(folder))
