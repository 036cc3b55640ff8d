"""Flags and resolution shared by the subcommands (estimate, probe, tune, preflight...)."""

from __future__ import annotations

import argparse
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import Knob, format_value, knobs
from advisor.core.plan import Plan, flag_of


def whole_number(flag: str, minimum: int = 1):
    """argparse type: an int of at least ``minimum`` (argparse names the flag in its message)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number (got {text!r})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {text!r})")
        return value
    return parse


def positive_int(flag: str):
    return whole_number(flag, 1)


def number(flag: str, low: float | None = None, low_inclusive: bool = False, high: float | None = None):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number (got {text!r})") from None
        if low is not None and (value < low or (value == low and not low_inclusive)):
            raise argparse.ArgumentTypeError(f"must be {'at least' if low_inclusive else 'greater than'} {low} (got {text!r})")
        if high is not None and value >= high:
            raise argparse.ArgumentTypeError(f"must be below {high} (got {text!r})")
        return value
    return parse


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and GPU")
    g.add_argument("--model", required=True, help="catalog name or alias (qwen7b, llama8b...), hub id, or a local directory with config.json")
    g.add_argument("--trust-remote-code", action="store_true", help="allow running model code shipped in a model directory")
    g.add_argument("--gpu", help="GPU from the catalog (rtx-4090, a100-80gb, h100...); default: the detected GPU")
    g.add_argument("--gpu-budget", help='memory budget: "24GB", "24 GiB", "24000MiB" or "90%%" of the GPU (GB = GiB = 2^30 bytes)')


HOST_BUDGET_HELP = ('host memory (RAM) of the machine the run is for: "64GB", "64 GiB" or "50%%" of this machine\'s RAM '
                    "(GB = GiB = 2^30 bytes); default: this machine's RAM as detected (psutil, or its container's "
                    "limit). A plan fits when its host peak (pinned and pageable) fits it less the OS reserve")


def add_host_budget_flag(p) -> None:
    """``--host-budget``: parsed like --gpu-budget (advisor.core.target.resolve_host_budget)."""
    p.add_argument("--host-budget", help=HOST_BUDGET_HELP)


def add_plan_flags(p: argparse.ArgumentParser, plan: type = Plan) -> None:
    """A flag per knob of ``plan``, each from its declaration (advisor.core.knobs): flag, parse type,
    choices, help and the default the help states."""
    g = p.add_argument_group("training plan")
    for k in knobs(plan):
        add_knob_flag(g, k, plan)
    add_gpus_flags(p)


def add_knob_flag(g, k: Knob, plan: type = Plan) -> None:
    """The flag of one knob (and its alias flag, if it declares one). A knob the card decides (precision,
    attention: advisor.core.card_rules.CARD_DECIDED) has no fixed default: ``plan_from_args`` asks the card."""
    from advisor.core.card_rules import CARD_DECIDED, CARD_DEFAULT_MEANS

    card_decided = k.name in CARD_DECIDED
    parts = [k.help]
    if k.cli.implies:
        parts.append(f"(implies {flag_of(k.cli.implies[0], plan)})")
    if card_decided:
        parts.append(f"(default: {CARD_DEFAULT_MEANS[k.name]})")
    elif k.default_text:
        parts.append(k.default_text)
    options: dict[str, Any] = {"dest": k.name, "help": " ".join(parts)}
    if k.is_switch:
        if k.default is not False:
            raise TypeError(f"{k.name}: a switch on by default has no flag to turn it on")
        g.add_argument(k.flag, action="store_true", **options)
    else:
        options["default"] = None if (k.cli.default or k.cli.alias or card_decided) else k.default
        if k.choices is not None:
            options["choices"] = k.choices
        if k.cli.parse is not None:
            options["type"] = k.cli.parse
        elif k.range is not None and k.range.whole:
            options["type"] = whole_number(k.flag, int(k.range.low))
        elif k.range is not None:
            options["type"] = number(k.flag, low=k.range.low, low_inclusive=k.range.low_inclusive, high=k.range.high)
        if k.cli.metavar:
            options["metavar"] = k.cli.metavar
        g.add_argument(k.flag, **options)
    if k.cli.alias:
        flag, value = k.cli.alias
        g.add_argument(flag, dest=_alias_dest(flag), action="store_true",
                       help=f"the same as {k.flag} {format_value(value)}")


def _alias_dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_gpus_flags(p: argparse.ArgumentParser) -> None:
    from advisor.memory.sharding import DEFAULT_SHARDING, STRATEGIES

    g = p.add_argument_group("several GPUs")
    g.add_argument("--gpus", type=positive_int("--gpus"), default=1, help="data-parallel GPUs (per-GPU ledger)")
    g.add_argument("--sharding", choices=STRATEGIES, default=DEFAULT_SHARDING,
                   help="how model state is split across --gpus (ZeRO-2/3, FSDP full shard, or replicated)")


def plan_from_args(args: argparse.Namespace, plan: type = Plan, card=None) -> Plan:
    """The Plan the knobs' flags describe (each knob read by its declaration), validated.

    ``card`` (advisor.core.card_rules.Card: the GPU named or detected, the model's class): the precision and
    attention not given are its choices, and a plan it cannot run is refused (flag, what it lacks, what to use).
    None: no card known (bf16, sdpa; nothing refused for a card)."""
    from advisor.core.card_rules import CARD_DECIDED, Card

    values: dict[str, Any] = {}
    for k in knobs(plan):
        value = getattr(args, k.name, None)
        if value is None and k.name in CARD_DECIDED:
            value = (card or Card()).choice(k.name, values)
        if k.cli.alias and getattr(args, _alias_dest(k.cli.alias[0]), False):
            flag, meant = k.cli.alias
            if value not in (None, meant):
                raise AdvisorInputError(flag, f"is {k.flag} {format_value(meant)}, which contradicts {k.flag} {value}",
                                        value)
            value = meant
        values[k.name] = k.default if value is None and not k.cli.default else value
    for k in knobs(plan):  # defaults that follow other knobs (the quantization follows the method)
        if k.cli.default and values[k.name] is None:
            values[k.name] = k.cli.default(values)
    for k in knobs(plan):  # a knob that turns another on (--checkpoint-layers: --gradient-checkpointing)
        if k.cli.implies and values[k.name] != k.default:
            values[k.cli.implies[0]] = k.cli.implies[1]
    result = plan(**values).validate()
    problems = card.problems(result) if card is not None else []
    if len(problems) == 1:
        raise problems[0]
    if problems:
        from advisor.core.errors import ConfigErrors

        raise ConfigErrors(problems)
    return result


def target_from_args(args: argparse.Namespace, **rules: Any):
    """The command's Target (model, GPU, budget, whether the GPU is assumed) from --model, --gpu and
    --gpu-budget, by the one rule every command uses (advisor.core.target.resolve_target; ``rules`` are
    its keyword options)."""
    from advisor.core.target import resolve_target

    return resolve_target(args.model, gpu=getattr(args, "gpu", None), gpu_budget=getattr(args, "gpu_budget", None),
                          trust_remote_code=getattr(args, "trust_remote_code", False),
                          host_budget=getattr(args, "host_budget", None), **rules)


def check_plan_against_model(model, plan) -> None:
    """Model-dependent rules (LoRA targets that exist, sequence within the model's context)."""
    from advisor.core.adapters import attention_linears
    from advisor.core.plan import lora_target_modules

    lora_target_modules(plan, list(model.linear_shapes()), attention_linears(model))
    if plan.checkpoint_layers is not None and plan.checkpoint_layers > model.num_layers:
        raise AdvisorInputError("--checkpoint-layers", f"{model.name} has {model.num_layers} decoder layers",
                                plan.checkpoint_layers)
    if model.max_position_embeddings and plan.seq_len > model.max_position_embeddings:
        raise AdvisorInputError("--seq-len", f"longer than {model.name}'s context of {model.max_position_embeddings:,} tokens",
                                plan.seq_len)


def add_study_flags(p: argparse.ArgumentParser) -> None:
    """STUDY or --storage/--study, as advisor.search.locate.resolve_storage reads them (report, export)."""
    p.add_argument("study", nargs="?", metavar="STUDY",
                   help="study folder holding study.db (reports/<study>/), its study.db, or a study name under "
                        "--reports-dir")
    p.add_argument("--storage", help="Optuna storage URL instead of STUDY (e.g. postgresql://user@host/db)")
    p.add_argument("--study", dest="study_name", metavar="NAME",
                   help="study name inside the storage (needed when it holds more than one)")
    p.add_argument("--reports-dir", default="reports", help="where a bare STUDY name is looked up")
