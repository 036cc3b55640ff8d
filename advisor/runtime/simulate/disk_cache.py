"""A traced step kept on disk for the next process that asks the same question.

Opt-in: ``$ADVISOR_SIMULATION_CACHE`` names a folder (the test suite sets one for its whole run, tests/conftest.py,
so the workers and the CLIs they start trace each model and plan once). A result is filed under a hash of
everything that can change the trace: the question (model, plan, how it is traced), this package's code and data
files, and the versions of the libraries whose code the trace runs. A file that cannot be read is traced again;
a file is written whole or not at all (a temporary file renamed over it), so processes sharing the folder never
read half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, TypeVar

ENV = "ADVISOR_SIMULATION_CACHE"
PACKAGE = Path(__file__).resolve().parents[2]
TRACED_LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "deepspeed", "trl", "torchao",
                    "liger-kernel", "galore-torch", "apollo-torch", "lomo-optim", "cut-cross-entropy")
"""The distributions whose code a trace may run (a new version may allocate otherwise)."""

T = TypeVar("T")


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of this package's code and data files and of the traced libraries' versions."""
    h = hashlib.sha256(sys.version.encode())
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".yaml", ".json") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(PACKAGE)).encode())
            h.update(path.read_bytes())
    for name in TRACED_LIBRARIES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "absent"
        h.update(f"{name}={version}".encode())
    return h.hexdigest()


def kept(question: Callable[[], dict[str, Any]], compute: Callable[[], T]) -> T:
    """``compute()``'s result, read from the folder ``$ADVISOR_SIMULATION_CACHE`` names when ``question()`` (plain
    data: what the trace depends on besides the code; asked only where the folder is set) was answered there
    before, else computed and filed there."""
    root = os.environ.get(ENV)
    if not root:
        return compute()
    text = json.dumps(question(), sort_keys=True, default=str)
    key = hashlib.sha256((code_fingerprint() + text).encode()).hexdigest()
    path = Path(root) / f"{key}.pickle"
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        pass  # not there yet, or unreadable: traced again
    result = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(pickle.dumps(result))
        os.replace(partial, path)
    except OSError:
        pass  # a folder that cannot be written keeps nothing; the answer stands
    return result
