"""ProbeRequest: everything the child process needs, written by the parent as one JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

FAULTS = ("none", "hang", "segfault", "raise", "oom", "grandchild_hang", "exit")
"""Faults the child can be told to inject for real (tests of the runner's robustness):
hang (sleeps forever after its first step), segfault (reads address 0 through ctypes), raise (a Python
exception), oom (allocates until the memory limit stops it), grandchild_hang (starts a grandchild that
sleeps, then hangs), exit (os._exit(3) without a result)."""


@dataclass(frozen=True)
class ProbeRequest:
    """One probe, as the child process reads it."""

    spec: dict[str, Any]
    """The ModelSpec (to_dict())."""
    plan: dict[str, Any]
    """The Plan (to_dict())."""
    device: str = "cpu"
    """cpu or cuda."""
    steps: int = 3
    """Measured optimizer steps."""
    warmup: int = 1
    """Warm-up optimizer steps (run, not timed)."""
    data: str | None = None
    """A JSONL (field "text") or text file to train on; None: synthetic token ids."""
    memory_limit_bytes: int | None = None
    """Budget: on a GPU the caching allocator's cap for the whole process; on the CPU the cap on what the probe
    allocates."""
    weights_dir: str | None = None
    """Directory with real weights (safetensors / bin); None: random initialization."""
    eval_texts: tuple[str, ...] = ()
    """Text files for eval fidelity and eval loss (used only with real weights)."""
    max_eval_tokens: int = 2048
    """Tokens of eval text at most (fidelity costs a reference model's full-vocabulary log-probs)."""
    num_layers: int | None = None
    """Build only this many decoder layers (None: all)."""
    quant_impl: str = "auto"
    """Passed to build_training_setup."""
    seed: int = 0
    """Seed of weights and synthetic data."""
    fault: str = "none"
    """A fault to inject for real (see FAULTS)."""
    fidelity: bool = True
    """With real weights and eval texts: also load the 16-bit base and measure the KL of the plan's base from it
    (False: the eval losses only, without a second model in memory)."""
    eval_window: int | None = None
    """Tokens per eval window (None: the plan's seq_len, at most 512). Runs whose eval losses are compared
    need the same windows: a window's loss depends on how much context its tokens have."""
    learning_rate: float | None = None
    """Constant learning rate of every parameter group (None: the optimizer's as Trainer builds it, whose
    TrainingArguments default 5e-5 memory and speed do not depend on; the finalists' quality runs set the
    rate an export trains with)."""

    def write(self, path: Path) -> None:
        d = asdict(self)
        d["eval_texts"] = list(self.eval_texts)
        path.write_text(json.dumps(d), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> "ProbeRequest":
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["eval_texts"] = tuple(d.get("eval_texts", ()))
        return cls(**d)
