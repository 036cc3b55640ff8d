"""`advisor tui`: open a study (finished, or running elsewhere) in the Textual app to browse and export."""

from __future__ import annotations

import argparse
from pathlib import Path

from advisor.errors import AdvisorInputError


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
    p.add_argument("--poll", type=float, default=1.5, metavar="SECONDS", help="how often to look for new trials")
    p.set_defaults(run=run)


def resolve(args: argparse.Namespace) -> tuple[str, str]:
    """(storage URL, study name) from STUDY or --storage/--study; AdvisorInputError naming the flag."""
    if args.storage and args.study_dir:
        raise AdvisorInputError("STUDY", "give a study directory or --storage, not both", args.study_dir)
    if args.poll <= 0:
        raise AdvisorInputError("--poll", "must be greater than 0 seconds", args.poll)
    if args.storage:
        storage = args.storage
        if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).is_file():
            raise AdvisorInputError("--storage", "no such SQLite file", storage)
        where = "--storage"
    elif args.study_dir:
        folder = Path(args.study_dir)
        if not folder.is_dir() and not folder.is_absolute():
            folder = Path(args.reports_dir) / args.study_dir
        if not folder.is_dir():
            raise AdvisorInputError("STUDY", f"no such study directory (looked in . and {args.reports_dir}/)",
                                    args.study_dir)
        db = folder / "study.db"
        if not db.is_file():
            raise AdvisorInputError("STUDY", "the directory holds no study.db", str(folder))
        storage = f"sqlite:///{db.resolve()}"
        where = "STUDY"
    else:
        raise AdvisorInputError("STUDY", "name a study directory (reports/<study>) or give --storage and --study",
                                None, show_value=False)
    try:
        import optuna

        names = optuna.get_all_study_names(storage)
    except Exception as e:  # noqa: BLE001 - a bad URL or an unreadable database, as one line
        raise AdvisorInputError(where, f"cannot read the study storage ({type(e).__name__}: {e})", storage) from None
    if args.study:
        if args.study not in names:
            raise AdvisorInputError("--study", f"no such study there (studies: {', '.join(names) or 'none'})",
                                    args.study)
        return storage, args.study
    if len(names) == 1:
        return storage, names[0]
    if args.study_dir and Path(args.study_dir).name in names:
        return storage, Path(args.study_dir).name
    raise AdvisorInputError("--study", f"the storage holds {len(names)} studies; name one with --study "
                            f"({', '.join(names) or 'none'})", None, show_value=False)


def run(args: argparse.Namespace) -> int:
    from advisor.tui import open_study_app

    storage, name = resolve(args)
    app = open_study_app(storage, name, export_dir=args.export, poll_s=args.poll)
    app.run()
    for kind, path in app.exported.items():
        print(f"exported {kind}: {path}")
    return 0
