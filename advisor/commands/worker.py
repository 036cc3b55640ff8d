"""`advisor worker`: join a study in a shared storage (PostgreSQL) and run its trials on this GPU."""

from __future__ import annotations

import argparse
import os
import sys

from advisor.commands.common import positive_int
from advisor.runtime.backends import BACKENDS


def add_parser(subs) -> None:
    p = subs.add_parser("worker", help="join a shared study and run its trials (one worker per GPU)",
                        description="Any number of workers on any hosts join one study in a shared Optuna storage. "
                                    "A worker that dies mid-trial has that trial failed by heartbeat and retried by "
                                    "another.")
    p.add_argument("--storage", required=True, help="Optuna RDB URL, e.g. postgresql://user:pass@host/db")
    p.add_argument("--study", required=True, help="study name (made by advisor tune --storage URL --study NAME)")
    p.add_argument("--gpu", type=int, metavar="INDEX", help="CUDA device index to probe on (sets CUDA_VISIBLE_DEVICES)")
    p.add_argument("--backend", choices=BACKENDS,
                   help="override the study's backend for this worker")
    p.add_argument("--heartbeat", type=positive_int, default=10,
                   help="seconds between heartbeats; a trial is retried after 3 missed beats")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    from advisor.search.storage import redact
    from advisor.search.tuner import Tuner, WORKER_ID, settings_from_study

    # the target (model, GPU, budget) is the study's description; this machine only decides where probes run
    settings = settings_from_study(args.storage, args.study, args.backend, args.heartbeat)
    if settings.backend == "cuda":
        from advisor.core.catalog import detect_gpu
        from advisor.runtime.backends import resolve_backend

        resolve_backend("cuda", detect_gpu())
    tuner = Tuner(settings)
    tuner.open_study()
    print(f"worker {WORKER_ID} joined {args.study} at {redact(args.storage)} "
          f"({tuner.finished_count()}/{settings.trials} finished)", file=sys.stderr)
    try:
        tuner.run()
    except KeyboardInterrupt:
        return 130
    print(f"worker {WORKER_ID}: study has {tuner.finished_count()}/{settings.trials} finished trials", file=sys.stderr)
    return 0
