"""`advisor preflight` (go / no-go for a config) and `advisor doctor` (an error log → causes and fixes)."""

from __future__ import annotations

import argparse
import json

from advisor.commands.common import _argparse_type, add_host_budget_flag, number, positive_int
from advisor.core.fit import HEADROOM
from advisor.core.plan import parse_seq_len


def add_parser(subs) -> None:
    p = subs.add_parser("preflight", help="go / no-go for a training config before a long run",
                        description="Check a training config (advisor.yaml, TrainingArguments with sections, axolotl "
                                    "or LLaMA-Factory YAML) for environment, config, memory and time problems. Exit "
                                    "code: 0 GO, 1 RISKY or NO-GO, 2 bad input.")
    p.add_argument("config", help="advisor.yaml, TrainingArguments YAML/JSON, axolotl or LLaMA-Factory YAML")
    p.add_argument("--gpu-budget", help='memory budget ("24GB", "90%%"); default: the GPU\'s memory')
    p.add_argument("--gpu", help="GPU from the catalog; default: the detected one")
    add_host_budget_flag(p)
    p.add_argument("--gpus", type=positive_int,
                   help="the run's data-parallel GPUs (the budget is per GPU); default: as the config says "
                        "(advisor.yaml's advisor.gpus), else 1")
    p.add_argument("--data", help="training data (JSONL with 'text', or .txt): longest sequence and total tokens")
    p.add_argument("--max-seq-len", type=positive_int, help="longest sequence (without --data)")
    p.add_argument("--seq-len", type=_argparse_type(parse_seq_len),
                   help="max: the longest sequence the config's plan fits (GO with it, as max_seq_len in the JSON); "
                        "a number: as --max-seq-len")
    p.add_argument("--epochs", type=number(low=0), help="epochs for the time estimate")
    p.add_argument("--headroom", type=number(low=0, low_inclusive=True, high=1), default=HEADROOM,
                   help="fraction of the budget kept free (default: %(default)s)")
    p.add_argument("--probe", action="store_true",
                   help="also run a short real training probe held to the budget (a failed probe is NO-GO)")
    p.add_argument("--backend", choices=("simulate", "estimate"), default="simulate",
                   help="how the memory check knows the peak: a fake-tensor trace (simulate) or the closed-form "
                        "ledger (estimate, instant)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_preflight_cmd)

    d = subs.add_parser("doctor", help="match an error log to causes and fixes")
    d.add_argument("logfile", help="a training log or traceback ('-' for standard input)")
    d.add_argument("--config",
                   help="the run's config, for the advisor's own numbers (which ledger category exceeds what)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(run=run_doctor_cmd)


def run_preflight_cmd(args: argparse.Namespace) -> int:
    from advisor.diagnosis.preflight import PreflightInput, run_preflight

    result = run_preflight(PreflightInput(
        config=args.config, gpu_budget=args.gpu_budget, gpu=args.gpu, data=args.data, probe=args.probe,
        max_seq_len=args.max_seq_len, seq_len=args.seq_len, headroom=args.headroom, epochs=args.epochs,
        trust_remote_code=args.trust_remote_code, backend=args.backend, host_budget=args.host_budget,
        gpus=args.gpus))
    who = memory_answered_by(result.model, result.plan, result.extra.get("backend", args.backend))
    if args.json:
        print(json.dumps({**result.to_dict(), **who}, indent=2, default=str))
    else:
        from advisor.diagnosis.findings import print_findings

        color = {"GO": "green", "RISKY": "yellow", "NO-GO": "red"}[result.verdict]
        from rich.markup import escape

        print_findings(result.findings, header=f"[bold {color}]{result.verdict}[/] {result.model.name} · "
                                               f"{escape(result.plan.short())}"
                                               + (f" · budget {result.budget}" if result.budget else ""))
        print(f"memory check answered by the {who['answered_by']}: {who['answered_by_reason']}")
    return result.exit_code


def memory_answered_by(model, plan, backend: str) -> dict:
    """Who answered the memory check: the simulation (--backend simulate, or a model the closed form cannot
    describe: advisor.memory.closed_form) or the closed form."""
    from advisor.memory.closed_form import CLOSED_FORM, SIMULATION, closed_form_describes

    if model is None or plan is None:
        return {"answered_by": None, "answered_by_reason": "no memory check (the config did not resolve)"}
    if backend == "simulate":
        return {"answered_by": SIMULATION,
                "answered_by_reason": "--backend simulate: the real model code on fake tensors"}
    describes, why = closed_form_describes(model, plan)
    return {"answered_by": CLOSED_FORM if describes else SIMULATION, "answered_by_reason": why}


def run_doctor_cmd(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from advisor.diagnosis.doctor import diagnose
    from advisor.core.errors import AdvisorInputError

    if args.logfile == "-":
        text = sys.stdin.read()
    else:
        p = Path(args.logfile)
        if not p.is_file():
            raise AdvisorInputError("logfile", "no such file", args.logfile)
        text = p.read_text(encoding="utf-8", errors="replace")
    report = plan = gpu = None
    if args.config:
        from advisor.runtime.backends import get_backend
        from advisor.core.catalog import resolve_gpu, resolve_model
        from advisor.configs.read import read_config

        name, plan, extras = read_config(args.config)
        model = resolve_model(name)
        planned_for = (extras.get("gpu") or {}).get("key")  # advisor.yaml's card (advisor.gpu)
        gpu = resolve_gpu(planned_for) if planned_for and planned_for != "detected" else None
        report = get_backend("estimate").measure(model, plan, None)
        if plan.task != "sft":  # GRPO/DPO: the run's phases (generate, score, train) for the RL entries
            from advisor.runtime.phases import with_phases

            report = with_phases(model, plan, None, report)
    findings = diagnose(text, report, plan, gpu)
    if args.json:
        print(json.dumps({"findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        from advisor.diagnosis.findings import print_findings

        if not findings:
            print("No known problem recognised in this log.")
        print_findings(findings)
    return 1 if findings else 0
