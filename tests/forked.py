"""One forkserver per test process (multiprocessing's, shared by every context that forks from it) that has imported
the libraries a child of the tests imports: each child forked from it starts without a fresh interpreter's imports
(torch, transformers, peft and TRL take about 6 s, DeepSpeed about 3 s more). Used by the exported scripts' runs
(tests/export_runs.py) and the real sequence-parallel ranks (tests/test_sequence_parallel.py)."""

from __future__ import annotations

import multiprocessing

PRELOAD = ["torch", "transformers", "peft", "trl", "datasets", "deepspeed"]


def forkserver_context():
    """The forkserver context, its server preloading PRELOAD (set before it first starts)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
