"""`advisor tui`: open a study (finished, or running elsewhere) in the Textual app to browse and export."""

from __future__ import annotations

import argparse

from advisor.core.errors import AdvisorInputError
from advisor.ui.tui import POLL_SECONDS


def add_parser(subs) -> None:
    p = subs.add_parser(
        "tui", help="browse a study in the terminal app: trials, ledgers, Pareto front, export",
        description="Open a study made by `advisor tune` in the Textual app. A study still running elsewhere "
                    "is polled for new trials. Keys: enter details, e export, s sort, / filter, q quit.")
    p.add_argument("study_dir", nargs="?", metavar="STUDY",
                   help="a study directory holding study.db (reports/<study>), or the name of one under --reports-dir")
    p.add_argument("--storage", help="Optuna storage URL instead of STUDY (e.g. postgresql://host/db)")
    p.add_argument("--study", help="study name in the storage (default: the only one there, or STUDY's name)")
    p.add_argument("--reports-dir", default="reports", help="where study directories are looked up by name")
    p.add_argument("--export", metavar="DIR", help="default directory of the export dialog "
                                                   "(default: <study directory>/export)")
    p.add_argument("--poll", type=float, default=POLL_SECONDS, metavar="SECONDS",
                   help="how often to look for new trials")
    p.set_defaults(run=run)


def resolve(args: argparse.Namespace) -> tuple[str, str]:
    """(storage URL, study name) from STUDY or --storage/--study; AdvisorInputError naming the flag."""
    from advisor.search.locate import resolve_storage, study_name

    if args.poll <= 0:
        raise AdvisorInputError("--poll", "must be greater than 0 seconds", args.poll)
    storage, folder = resolve_storage(args.study_dir, args.storage, args.study, args.reports_dir)
    return storage, study_name(storage, args.study, folder)


def run(args: argparse.Namespace) -> int:
    from advisor.ui.tui import open_study_app

    storage, name = resolve(args)
    app = open_study_app(storage, name, export_dir=args.export, poll_s=args.poll)
    app.run()
    for kind, path in app.exported.items():
        print(f"exported {kind}: {path}")
    return 0
