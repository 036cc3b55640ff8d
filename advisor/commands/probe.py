"""`advisor probe`: a short real training run of one plan in a child process, measured."""

from __future__ import annotations

import argparse
import json

from advisor.commands._help import DefaultsHelpFormatter
from advisor.commands.common import add_model_flags, add_plan_flags, number, positive_int, whole_number


def add_parser(subs) -> None:
    p = subs.add_parser(
        "probe", help="run a plan for a few real steps (GPU or CPU) and measure it",
        description="Run a training plan for a few real optimizer steps in an isolated child process and measure "
                    "its peak memory, step time, tokens/s, losses and (with real weights) eval fidelity. "
                    "Out of memory, crashes and hangs end as a status, never as a traceback.",
        formatter_class=DefaultsHelpFormatter)
    add_model_flags(p)
    add_plan_flags(p)
    g = p.add_argument_group("probe")
    g.add_argument("--device", choices=("cuda", "cpu"),
                   help="where to run (default: cuda when a GPU is detected, else cpu)")
    g.add_argument("--steps", type=positive_int, default=3, help="measured optimizer steps")
    g.add_argument("--warmup", type=whole_number(0), default=1, help="untimed warm-up optimizer steps")
    g.add_argument("--timeout", type=number(low=0), default=300.0, help="seconds before the child is killed")
    g.add_argument("--data", help='JSONL (field "text") or text file to train on (default: synthetic token ids)')
    g.add_argument("--weights", metavar="DIR", help="load real weights from DIR (then eval fidelity is measured)")
    g.add_argument("--eval-texts", nargs="+", metavar="FILE",
                   help="eval texts for fidelity (default: the shipped eval texts)")
    g.add_argument("--num-layers", type=positive_int, help="build only this many decoder layers")
    g.add_argument("--seed", type=int, default=0, help="seed of random weights and synthetic data")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from advisor.commands.common import check_plan_against_model, plan_from_args, target_from_args
    from advisor.core.card_rules import Card
    from advisor.runtime.probe import run_probe

    target = target_from_args(args)
    model, budget = target.model, target.budget
    device = args.device or ("cuda" if target.detected is not None else "cpu")
    # the run's card is the GPU here (a cpu probe: none); the model's class either way (advisor.core.card_rules)
    plan = plan_from_args(args, card=Card.of(target.detected if device == "cuda" else None, model))
    check_plan_against_model(model, plan)
    result = run_probe(model, plan, device=device, steps=args.steps, warmup=args.warmup, timeout=args.timeout,
                       data=args.data, memory_limit_bytes=budget.bytes if budget else None, weights_dir=args.weights,
                       eval_texts=args.eval_texts, num_layers=args.num_layers, seed=args.seed)
    if result.ok and device == "cuda" and result.tokens_per_s and args.num_layers is None:
        # measured beats predicted: the probe also refits this GPU model's step-time scales
        from advisor.speed.calibration import record_probe

        gpu = target.detected
        if gpu is not None:
            try:
                record_probe(model, plan, gpu, result.tokens_per_s)
            except (OSError, ValueError):
                pass
    if result.ok and device == "cuda":
        from advisor.memory.calibration import record_probe_result

        record_probe_result(result.to_dict())   # its CUDA context and allocator reserve, for later predictions
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render(result, budget))
    return 0 if result.ok else 1


def render(result, budget=None) -> str:
    """A plain-text summary of a ProbeResult (every figure measured)."""
    from advisor.core.units import format_bytes

    unit = budget.unit if budget else None

    def b(n):
        return "n/a" if n is None else format_bytes(n, unit)

    lines = [f"probe {result.model} on {result.device}: {result.status.upper()}"
             + (f" — {result.message}" if result.message else ""),
             f"  plan           {_short(result.plan)}",
             f"  steps          {result.steps_done} done ({result.warmup} warm-up + {result.steps} measured), "
             f"{result.wall_s:.1f} s wall, {result.exit}"]
    if result.peak_allocated_bytes is not None:
        lines.append(f"  peak tensors   {b(result.peak_allocated_bytes)}"
                     + (f" (during {result.peak_phase})" if result.peak_phase else "") + "  [measured]")
    if result.peak_reserved_bytes is not None:
        lines.append(f"  peak reserved  {b(result.peak_reserved_bytes)}  [measured]")
    if result.nvml_peak_bytes is not None:
        lines.append(f"  process (NVML) {b(result.nvml_peak_bytes)}  [measured]")
    if budget is not None:
        lines.append(f"  budget         {budget}")
    for key, value in result.breakdown.items():
        lines.append(f"    {key:<18} {b(value)}")
    if result.step_time_median_s is not None:
        lines.append(f"  step time      median {result.step_time_median_s * 1e3:.1f} ms, p90 "
                     f"{result.step_time_p90_s * 1e3:.1f} ms; {result.tokens_per_s:,.0f} tokens/s  [measured]")
    if result.losses:
        lines.append("  loss per step  " + ", ".join(f"{x:.4f}" for x in result.losses))
    if result.fidelity_kl is not None:
        lines.append(f"  eval fidelity  KL {result.fidelity_kl:.3g} nats/token over {result.fidelity_tokens} tokens; "
                     f"eval loss {result.eval_loss_base:.4f} -> {result.eval_loss_after:.4f}  [measured]")
    v = result.versions
    if v:
        lines.append("  versions       " + ", ".join(f"{k} {v[k]}" for k in v if v[k]))
    if result.gpu_name:
        lines.append(f"  gpu            {result.gpu_name}")
    lines += [f"  note: {n}" for n in result.notes]
    return "\n".join(lines)


def _short(plan: dict) -> str:
    from advisor.core.plan import Plan

    return Plan.from_dict(plan).short()
