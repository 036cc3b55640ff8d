"""The advisor CLI run inside the test process: the same ``advisor.cli.main`` the console script calls, without the
seconds a new interpreter spends importing torch and transformers. Tests of the console entry point itself (exit
codes and stderr of the real process) start it as a process instead (tests/test_cli_estimate.py)."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any


def advisor(*argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``advisor ARGV``."""
    from advisor.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def advisor_json(*argv: str) -> tuple[int, Any, str]:
    """``advisor ARGV`` (ending in --json): exit code, the JSON it printed (None if nothing) and stderr."""
    code, out, err = advisor(*argv)
    return code, (json.loads(out) if out.strip() else None), err
