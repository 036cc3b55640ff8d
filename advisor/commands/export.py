"""`advisor export`: write a study's chosen plan (or any trial's) as configs other tools run."""

from __future__ import annotations

import argparse
import json

from advisor.commands.common import add_study_flags


def add_parser(subs) -> None:
    from advisor.configs.formats import exported, format_names_help

    files = ", ".join(f.filename for f in exported().values())
    p = subs.add_parser("export", help=f"write a study's plan as {files}",
                        description="Export the plan the study chose (or --trial N) in the given formats:\n"
                        + "\n".join(f"  {f.name:13} {f.help}" for f in exported().values()),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_flags(p)
    p.add_argument("--format", action="append", metavar="FORMAT",
                   help=f"{format_names_help()} (repeat or comma-separate; default: all that can express the plan)")
    p.add_argument("--trial", type=int, metavar="N", help="export trial N instead of the chosen plan")
    p.add_argument("--out", metavar="DIR", help="output folder (default: <study folder>/export)")
    p.add_argument("--json", action="store_true", help="print the written paths as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from advisor.configs.trial_export import export_trial
    from advisor.core.errors import AdvisorInputError
    from advisor.search.select import select
    from advisor.ui.report import open_study, resolve_storage

    storage, folder = resolve_storage(args.study, args.storage, args.study_name, args.reports_dir)
    snap = open_study(storage, args.study_name, folder)
    d = snap.description
    if args.trial is not None:
        chosen = next((r for r in snap.records if r.number == args.trial), None)
        if chosen is None or chosen.state != "complete":
            raise AdvisorInputError("--trial", "no complete trial with this number in the study", args.trial)
    else:
        chosen = select(snap.records, d.budget.bytes, d.headroom, d.tolerance, d.budget.unit, d.rules).best
        if chosen is None:
            raise AdvisorInputError("STUDY", "the study has no feasible plan to export yet", snap.name)
    formats = [f.strip() for item in (args.format or []) for f in item.split(",") if f.strip()] or None
    out = Path(args.out) if args.out else (folder or Path(args.reports_dir) / snap.name) / "export"
    written = export_trial(chosen, str(out), formats, model=d.model, gpu=d.gpu, study_name=snap.name,
                           gpus=d.gpus, sharding=d.sharding)
    paths = {k: str(v) for k, v in written.items()}
    if args.json:
        print(json.dumps({"trial": chosen.number, "plan": chosen.plan_short, "gpus": d.gpus,
                          "sharding": d.sharding if d.gpus > 1 else None, "written": paths,
                          "skipped": getattr(written, "skipped", {})}, indent=2))
    else:
        print(f"trial #{chosen.number}: {chosen.plan_short}"
              + (f" on {d.gpus} GPUs, sharding {d.sharding}" if d.gpus > 1 else ""))
        for kind, path in paths.items():
            print(f"  {kind:13} {path}")
        for kind, why in getattr(written, "skipped", {}).items():
            print(f"  {kind:13} skipped: {why}")
    return 0
