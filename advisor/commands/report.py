"""`advisor report`: write report.html (self-contained, offline), report.md and trials.csv for a study."""

from __future__ import annotations

import argparse
import json

from advisor.commands.common import add_study_flags


def add_parser(subs) -> None:
    p = subs.add_parser(
        "report", help="write an HTML / Markdown / CSV report of a study",
        description="Render a study made by `advisor tune` as report.html (one self-contained file: plots inline, "
                    "no network), report.md and trials.csv, in the study's folder unless --out is given.")
    add_study_flags(p)
    p.add_argument("--out", metavar="DIR", help="where to write the report (default: the study's folder)")
    p.add_argument("--json", action="store_true", help="print the written paths as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from advisor.core.errors import AdvisorInputError
    from advisor.ui.report import gather, open_study, resolve_storage, write_report

    storage, folder = resolve_storage(args.study, args.storage, args.study_name, args.reports_dir)
    snap = open_study(storage, args.study_name, folder)
    if args.out:
        out = Path(args.out).expanduser()
        if out.exists() and not out.is_dir():
            raise AdvisorInputError("--out", "exists and is not a directory", args.out)
    else:
        out = folder if folder is not None else Path(args.reports_dir) / snap.name
    data = gather(snap)
    try:
        paths = write_report(data, out)
    except OSError as e:
        raise AdvisorInputError("--out", f"cannot write the report there ({e.strerror or e})", str(out)) from e
    if args.json:
        print(json.dumps({"study": snap.name, **{k: str(v) for k, v in paths.items()}}, indent=2))
    else:
        print(f"report of study {snap.name!r} ({len(snap.records)} trials) written:")
        for path in paths.values():
            print(f"  {path}")
        if data.selection.explanation:
            print(data.selection.explanation[0])
    return 0

