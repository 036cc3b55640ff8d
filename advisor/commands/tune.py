"""`advisor tune`: search the space in priority order and return the best-balanced plan."""

from __future__ import annotations

import argparse
import json
import sys

from advisor.commands._help import DefaultsHelpFormatter
from advisor.commands.common import add_plan_override_flags, add_setting_flags, plan_overrides, positive_int


def add_parser(subs, settings_cls: type | None = None) -> None:
    """``advisor tune``: the study settings' flags (advisor.search.settings, each from its declaration), the knob
    flags that fix a knob of the space (as advisor estimate takes them), and what the command itself does."""
    from advisor.search.settings import TuneSettings

    p = subs.add_parser(
        "tune", help="find the best plan for a model on a memory budget",
        description="Search memory techniques in priority order (quantized loading + PEFT, then gradient "
                    "checkpointing, then offload), measure each candidate, prune what does not fit, and return "
                    "the plan that best balances throughput and accuracy.",
        formatter_class=DefaultsHelpFormatter)
    add_setting_flags(p, settings_cls or TuneSettings)
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code shipped in a model directory")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="override space keys, e.g. method=qlora seq_len=2048")
    p.add_argument("--reports-dir", default="reports", help="where studies, reports and exports land")
    p.add_argument("--export", metavar="DIR", help="write the winner's configs (advisor.yaml, DeepSpeed, train.py...)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("--tui", action="store_true", help="run the study inside the Textual app")
    p.add_argument("--verbose", action="store_true",
                   help="also print every trial, the Pareto front and the answer's ledger (default: the answer, the "
                        "usual recipe beside it and why)")
    p.add_argument("--context-len", type=positive_int, help="inference: tokens per sequence (default: searched)")
    p.add_argument("--concurrency", type=positive_int, help="inference: sequences at once (default: the most that fit)")
    p.add_argument("--no-work", action="store_true",
                   help="create the study (in a shared --storage) and only watch while `advisor worker`s run it")
    add_plan_override_flags(p)
    p.set_defaults(run=run, settings_cls=settings_cls)


def build_settings(args: argparse.Namespace, settings_cls: type | None = None, lookup: bool = True):
    """The study's settings from the flags, frozen (advisor.search.settings.TuneSettings.from_flags): the knob
    flags become space overrides, and a study already stored under the name must ask the same question
    (``lookup``: False for settings that name no study of their own, seq_len=max's search)."""
    from advisor.search.settings import ATTR, TuneSettings
    from advisor.search.storage import stored_attr

    cls = settings_cls or getattr(args, "settings_cls", None) or TuneSettings
    overrides = plan_overrides(args, getattr(args, "overrides", None) or ())
    resolved = {}
    if getattr(args, "weights", None):
        from advisor.search.finalists import check_weights

        resolved["weights"] = check_weights(args.weights)
    settings = cls.from_flags(args, tuple(overrides), resolved=resolved,
                              lookup=(lambda storage, name: stored_attr(storage, name, ATTR)) if lookup else None)
    if settings.weights:
        from advisor.search.finalists import check_data, why_not_measured

        if not why_not_measured(settings.backend, settings.weights, settings.data):
            check_data(args.data)  # the quality runs need documents to hold out: said now, not after the study
    return settings


def check_budget_reachable(settings) -> None:
    from advisor.core.errors import AdvisorInputError
    from advisor.memory.ledger import LABELS
    from advisor.search.tuner import smallest_plan_report

    smallest = smallest_plan_report(settings)
    if smallest is None:
        raise AdvisorInputError("--space", "no valid plan in this space for this model", settings.space.name)
    plan, rep, host_note = smallest
    if rep.peak_bytes > settings.budget.bytes:
        fmt = settings.budget.format
        largest = max(rep.device, key=rep.device.get)
        from advisor.search.refusal import what_would_fit

        # what would fit is judged from the one-GPU ledger (ZeRO-3 over more GPUs divides it)
        more = what_would_fit(settings.model, plan, rep, settings.budget.bytes, settings.headroom, fmt,
                              settings.gpu) if settings.gpus == 1 else ""
        raise AdvisorInputError(
            "--gpu-budget", f"below the smallest plan of space {settings.space.name!r}: {plan.short()} needs "
            f"{fmt(rep.peak_bytes)} (estimated), {fmt(rep.peak_bytes - settings.budget.bytes)} over; its largest "
            f"part, {LABELS[largest].lower()}, is {fmt(rep.device[largest])} alone" + (f"; {more}" if more else "")
            + (f"; {host_note}" if host_note else ""), settings.budget.text)


def run(args: argparse.Namespace) -> int:
    if args.task == "inference":
        from advisor.commands._inference import refuse_study_flags, run_inference

        refuse_study_flags(args)
        from advisor.commands._inference import SERVE_SAMPLE_KNOBS

        # --task inference itself, and a prompt's images (the serving workload: advisor.memory.serve_vision)
        text_only = argparse.Namespace(**{k: (None if k in SERVE_SAMPLE_KNOBS else v) for k, v in vars(args).items()})
        fixed = [f for f in plan_overrides(text_only) if not f.startswith("task=")]
        if fixed:
            from advisor.core.errors import AdvisorInputError

            key = fixed[0].split("=", 1)[0]
            raise AdvisorInputError("--" + key.replace("_", "-"), "not supported with --task inference: it fixes a "
                                    "knob of the training search", fixed[0].split("=", 1)[1])
        return run_inference(args)
    from advisor.search.measured import WHY_ATTR, study_quality_lines
    from advisor.search.storage import redact
    from advisor.search.tuner import Tuner
    from advisor.ui.status import show_status

    show_status()  # a simulation (seconds to minutes) says so on stderr while it runs
    args, longest = with_longest_seq_len(args)
    settings = build_settings(args)
    check_budget_reachable(settings)
    if args.export:  # before the study runs, not after it: the answer would be lost with the export
        from advisor.core.errors import writable_folder

        writable_folder(args.export)
    if args.tui:
        from advisor.ui.tui import run_tui

        return run_tui(settings, export_dir=args.export)
    from advisor.ui.render import TuneProgress, print_tune_result

    progress = TuneProgress(settings, enabled=not args.json)
    first = ((f"the longest: {longest.max_seq_len} tokens", longest.params),) if longest is not None else ()
    tuner = Tuner(settings, on_event=progress.on_event, first=first)
    tuner.open_study()
    progress.start(*finished_counts(tuner))
    try:
        if args.no_work:
            tuner.wait_until_finished()
        else:
            tuner.run()
            tuner.polish()  # each non-exact change of the answer must pay for itself (advisor.search.select)
    except KeyboardInterrupt:
        progress.stop()
        print(f"interrupted: study {settings.study_name!r} is saved in {redact(settings.storage)}; run the same "
              "command to continue", file=sys.stderr)
        return 130
    progress.stop()
    try:
        quality = measure_quality(tuner, quiet=args.json)
    except KeyboardInterrupt:
        print(f"interrupted during the finalists' quality runs: study {settings.study_name!r} is saved in "
              f"{redact(settings.storage)}; run the same command to measure them", file=sys.stderr)
        return 130
    selection = study_quality_lines(tuner.selection(), tuner.study.user_attrs)
    records = tuner.records()
    exports = {}
    if args.export and selection.best is not None:
        exports = export_best(settings, selection.best, args.export)
    result = tune_result(settings, records, selection, exports, quality,
                         tuner.study.user_attrs.get(WHY_ATTR, ""))
    result.update(screened_by(settings, selection))
    result["rl"] = rl_of(settings, selection.best)
    if longest is not None:
        result.update(longest_fields(settings, longest, selection.best))
    result.update(length_fields(settings, selection.best, searched=longest is not None))
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_tune_result(settings, records, selection, exports, verbose=args.verbose)
        from rich.console import Console
        from rich.markup import escape

        from advisor.ui.render import layout_lines, length_lines, longest_lines

        console = Console()  # wrapped to the terminal, as the rest of the answer
        for line in [*layout_lines(result), *(longest_lines(result, settings.budget.format) if longest is not None
                                               else ()), *length_lines(result, settings.budget.format)]:
            console.print(escape(line), highlight=False)
        from advisor.search.rl_answer import rl_answer_lines

        for line in rl_answer_lines(result["rl"], settings.budget.format):
            print(line)
        if result["answered_by"] != "closed form":
            print(f"the estimate stage was answered by the {result['answered_by']}: {result['answered_by_reason']}")
    return 0 if selection.best is not None else 1


def answer_backend(best) -> str:
    """The backend that gave the answer's peak, for the figures printed beside it (its phases, its longer lengths),
    so that they compare with it: the simulation where the answer was simulated, else the closed form."""
    return "simulate" if best.source == "simulated" else "estimate"


def length_fields(settings, best, *, searched: bool) -> dict:
    """The study's sequence length and whether the user gave it; where not, the answer at 2K and 4K tokens
    (advisor.search.lengths)."""
    from advisor.core.plan import Plan
    from advisor.search.lengths import at_common_lengths, planned_tokens, seq_len_chosen

    chosen = searched or seq_len_chosen(settings)
    out: dict = {"seq_len": {"tokens": planned_tokens(settings.space.fixed), "chosen": chosen}}
    if not chosen and best is not None:
        out["at_common_lengths"] = [a.to_dict() for a in at_common_lengths(settings, Plan.from_dict(best.plan),
                                                                           answer_backend(best))]
    return out


def with_longest_seq_len(args: argparse.Namespace):
    """(args, the longest of the space) for seq_len=max (``--seq-len max`` or the override): the longest sequence
    the space reaches on the budget (advisor.search.longest_study), and args that fix the study's length 5% under
    it; (args, None) for any other length."""
    import copy

    from advisor.core.errors import AdvisorInputError
    from advisor.core.plan import SEQ_MAX

    overrides = list(getattr(args, "overrides", None) or ())
    is_max = [o for o in overrides if o.split("=", 1)[0].strip() == "seq_len"
              and o.split("=", 1)[-1].strip().lower() == SEQ_MAX]
    if getattr(args, "seq_len", None) != SEQ_MAX and not is_max:
        return args, None
    from advisor.memory.longest import STEP
    from advisor.search.longest_study import longest_of_space, run_measure, study_seq_len

    rest = copy.copy(args)
    rest.seq_len, rest.overrides = None, [o for o in overrides if o not in is_max]
    provisional = build_settings(rest, lookup=False)
    longest = longest_of_space(provisional, run_measure(provisional, "estimate"), run_measure(provisional, "simulate"))
    if longest is None:
        raise AdvisorInputError("--seq-len", f"no plan of space {provisional.space.name!r} with its accuracy loss "
                                f"within {provisional.tolerance} fits {provisional.budget.text} even at {STEP} tokens",
                                SEQ_MAX)
    rest.overrides = rest.overrides + [f"seq_len={study_seq_len(longest.max_seq_len, longest.fit.at_ceiling)}"]
    return rest, longest


def longest_fields(settings, longest, best) -> dict:
    """seq_len=max's figures in the tune result: the longest of the space and its plan (``max_seq_len``,
    ``seq_len_search``), the length the study ran at, and the longest the answer itself reaches."""
    from advisor.core.plan import Plan
    from advisor.search.longest_study import answer_longest

    out = {"max_seq_len": longest.max_seq_len, "seq_len_search": longest.to_dict()}
    if best is not None and best.plan:
        fit, by = answer_longest(settings, Plan.from_dict(best.plan), longest)
        out["answer_max_seq_len"] = fit.max_seq_len
        out["answer_seq_len_search"] = {**fit.to_dict(), "answered_by": by}
    return out


def finished_counts(tuner) -> tuple[int, int]:
    """(planned, polish): the finished trials of the study that evaluated a plan of their own, the planned
    --trials apart from those the polish added after them (advisor.search.tuner.is_polish)."""
    from advisor.ui.tui.state import finished_split

    return finished_split(tuner.records())


def measure_quality(tuner, quiet: bool = False):
    """The finalists' measured quality (advisor.search.finalists) when the study can measure it (or measured it
    before), else None; then the study keeps why (advisor.search.measured.WHY_ATTR), for `advisor report`."""
    from advisor.search.finalists import run_finalists, why_not_measured
    from advisor.search.measured import WHY_ATTR

    s = tuner.s
    say = None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    quality = run_finalists(tuner, tokens=s.quality_tokens, on_progress=say)
    if quality is None:
        why = why_not_measured(s.backend, s.weights, s.data) or "the study has no finalist"
        tuner.study.set_user_attr(WHY_ATTR, why)
    return quality


def rl_of(settings, best) -> dict | None:
    """A GRPO/DPO answer's generation settings beside its training ones, its phases and what vLLM holds
    (advisor.search.rl_answer); None for a supervised answer or none."""
    if best is None or not best.plan or best.plan.get("task", "sft") == "sft":
        return None
    from advisor.core.plan import Plan
    from advisor.search.rl_answer import rl_answer
    from advisor.search.tuner import train_gpus

    plan = Plan.from_dict(best.plan)
    return rl_answer(settings.model, plan, settings.gpu, train_gpus(settings.gpus, plan), settings.sharding,
                     answer_backend(best))


def screened_by(settings, selection) -> dict:
    """Who answered the estimate stage (advisor.memory.closed_form: the simulation for a model the closed form
    cannot describe), for the output."""
    from advisor.memory.closed_form import CLOSED_FORM, SIMULATION, closed_form_describes

    best = selection.best
    plan = getattr(best, "plan", None)
    describes, why = closed_form_describes(settings.model, plan if plan is not None and hasattr(plan, "seq_len")
                                           else None)
    return {"answered_by": CLOSED_FORM if describes else SIMULATION, "answered_by_reason": why}


def export_best(settings, best, out_dir: str) -> dict[str, str]:
    from advisor.configs.trial_export import export_trial

    from advisor.configs.export import ExportResult

    paths = export_trial(best, out_dir, None, model=settings.model, gpu=settings.gpu, study_name=settings.study_name,
                         gpus=settings.gpus, sharding=settings.sharding)
    return ExportResult({k: str(v) for k, v in paths.items()}, getattr(paths, "skipped", {}))


def tune_result(settings, records, selection, exports, quality=None, why_not: str = "") -> dict:
    from dataclasses import asdict

    from advisor.search.select import time_to_quality
    from advisor.search.storage import redact
    from advisor.search.tuner import is_polish

    def summary(t, *, full: bool):
        if t is None:
            return None
        out = {"number": t.number, "plan": t.plan, "plan_short": t.plan_short, "state": t.state, "reason": t.reason,
               "peak_bytes": t.peak_bytes, "run_peak_bytes": t.run_peak_bytes,
               "run_peak_phase": t.run_peak_phase or "train", "source": t.source,
               "host_bytes": t.host_bytes, "host_peak_bytes": t.host_peak_bytes,
               "host_pinned_bytes": t.host_pinned_bytes, "host_pageable_bytes": t.host_pageable_bytes,
               "tokens_per_s": t.tokens_per_s,
               "tokens_per_s_source": t.tokens_per_s_source, "token_factor": t.token_factor,
               "time_to_quality_s_per_token": time_to_quality(t) if t.tokens_per_s else None,
               "accuracy_loss": t.accuracy_loss, "accuracy_source": t.accuracy_source}
        if full:
            out.update(tensor_peak_bytes=t.tensor_peak_bytes, ledger=t.ledger, step_terms=t.step_terms,
                       host_ledger=t.host_ledger)
        return out

    best = selection.best
    return {
        "study": settings.study_name, "storage": redact(settings.storage), "backend": settings.backend,
        "model": settings.model.summary(),
        "gpu": {"name": settings.gpu.name, "assumed": settings.gpu_assumed},
        "budget": {"bytes": settings.budget.bytes, "text": settings.budget.text},
        "host_budget": host_budget_dict(settings),
        "headroom": settings.headroom, "accuracy_tolerance": settings.tolerance, "regime": settings.regime,
        "layout": layout_fields(settings, best),
        "best": summary(best, full=True),
        "recipe": summary(selection.recipe, full=False),
        "departures": [asdict(d) for d in selection.departures],
        "explanation": selection.explanation,
        "n_trials": sum(1 for r in records if r.state in ("complete", "pruned") and not r.duplicate_of
                        and not is_polish(r)),  # the planned --trials
        "n_polish": sum(1 for r in records if r.state in ("complete", "pruned") and is_polish(r)),
        "n_pruned": sum(1 for r in records if r.state == "pruned" and not r.duplicate_of),
        "n_repeats": sum(1 for r in records if r.duplicate_of is not None),
        "pareto": [{"number": t.number, "plan_short": t.plan_short, "peak_bytes": t.peak_bytes,
                    "host_peak_bytes": t.host_peak_bytes,
                    "tokens_per_s": t.tokens_per_s, "accuracy_loss": t.accuracy_loss} for t in selection.pareto],
        "trials": [r.to_dict() for r in records],
        "exports": exports,
        "quality": quality.to_dict() if quality is not None else {"source": "prior", "why": why_not},
    }


def layout_fields(settings, best) -> dict:
    """The run the answer is for: its GPUs, the engine that splits the model state (the plan's offload engine, else
    --sharding: advisor.memory.sharding.run_strategy) and the global batch every optimizer step trains (micro-batch x
    accumulation x data-parallel ranks; the space's global_batch asked for it)."""
    from advisor.memory.sharding import data_parallel_ranks, global_batch, run_strategy

    out = {"gpus": settings.gpus, "sharding": settings.sharding if settings.gpus > 1 else None,
           "global_batch_asked": settings.space.fixed.get("global_batch")}
    if best is not None:
        from advisor.core.plan import Plan

        plan = Plan.from_dict(best.plan)
        out.update(sharding=run_strategy(plan, settings.sharding) if settings.gpus > 1 else None,
                   data_parallel_ranks=data_parallel_ranks(settings.gpus, plan),
                   global_batch=global_batch(settings.gpus, plan))
    return out


def host_budget_dict(settings) -> dict | None:
    """The host budget of a tune result: the RAM, how it was set, and what the host rule leaves usable."""
    from advisor.core.fit import host_reserve_bytes, host_usable_bytes

    hb = settings.host_budget
    if hb is None:
        return None
    return {"bytes": hb.bytes, "text": hb.text, "detected": settings.host_detected,
            "os_reserve_bytes": host_reserve_bytes(hb.bytes), "usable_bytes": int(host_usable_bytes(hb.bytes))}
