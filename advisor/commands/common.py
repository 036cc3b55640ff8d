"""Flags and resolution shared by the subcommands (estimate, probe, tune, preflight...)."""

from __future__ import annotations

import argparse
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import Knob, format_value, knobs
from advisor.core.plan import Plan, flag_of


def whole_number(minimum: int = 1):
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


positive_int = whole_number(1)
"""argparse type: a whole number of at least 1."""


def number(low: float | None = None, low_inclusive: bool = False, high: float | None = None):
    """argparse type: a number in the range given (argparse names the flag in its message)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number (got {text!r})") from None
        if low is not None and (value < low or (value == low and not low_inclusive)):
            raise argparse.ArgumentTypeError(
                f"must be {'at least' if low_inclusive else 'greater than'} {low} (got {text!r})")
        if high is not None and value >= high:
            raise argparse.ArgumentTypeError(f"must be below {high} (got {text!r})")
        return value
    return parse


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and GPU")
    g.add_argument("--model", required=True,
                   help="catalog name or alias (qwen7b, llama8b...), hub id, or a local directory with config.json")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow running model code shipped in a model directory")
    g.add_argument("--gpu", help="GPU from the catalog (rtx-4090, a100-80gb, h100...); default: the detected GPU")
    g.add_argument("--gpu-budget",
                   help='memory budget: "24GB", "24 GiB", "24000MiB" or "90%%" of the GPU (GB = GiB = 2^30 bytes)')


HOST_BUDGET_HELP = ('host memory (RAM) of the machine the run is for: "64GB", "64 GiB" or "50%%" of this '
                    "machine's RAM "
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
        if k.choices is not None and k.cli.parse is None:  # a knob's own parse checks its words (--task)
            options["choices"] = k.choices
            if _whole_choices(k):
                options["type"] = int  # numbered levels (--vllm-sleep 0|1|2)
        if k.cli.parse is not None:
            options["type"] = _argparse_type(k.cli.parse)
        elif k.range is not None and k.range.whole:
            options["type"] = whole_number(int(k.range.low))
        elif k.range is not None:
            options["type"] = number(low=k.range.low, low_inclusive=k.range.low_inclusive, high=k.range.high)
        if k.cli.metavar:
            options["metavar"] = k.cli.metavar
        if k.cli.repeat:  # each flag one more value of the tuple
            options.update(action="append", default=None)
        g.add_argument(k.flag, **options)
    add_alias_flag(g, k)


def _argparse_type(parse):
    """A knob's parse as an argparse type: its input error is argparse's one line naming the flag and the value
    (argparse turns any other ValueError into "invalid <lambda> value")."""
    def typed(text):
        try:
            return parse(text)
        except AdvisorInputError as e:
            raise argparse.ArgumentTypeError(f"{e.rule} (got {text!r})") from None
    return typed


def _whole_choices(k: Knob) -> bool:
    """A knob whose choices are whole numbers (vLLM's sleep levels): its flag parses an int."""
    return all(isinstance(c, int) and not isinstance(c, bool) for c in k.choices)


def add_alias_flag(g, k) -> None:
    """A knob's shorthand flag (``Cli.alias``: ``--chunked-ce`` for ``--loss chunked``), as store_true."""
    if k.cli.alias:
        flag, value = k.cli.alias
        means = k.flag if value is True else f"{k.flag} {format_value(value)}"
        if k.cli.alias_implies:
            implied, implied_value = k.cli.alias_implies
            means += " " + flag_of(implied) + ("" if implied_value is True else f" {format_value(implied_value)}")
        said = f"{k.cli.alias_help}; " if k.cli.alias_help else ""
        g.add_argument(flag, dest=_alias_dest(flag), action="store_true", help=f"{said}the same as {means}")


def alias_given(args: argparse.Namespace, k) -> bool:
    """Whether knob ``k``'s shorthand flag was given."""
    return bool(k.cli.alias and getattr(args, _alias_dest(k.cli.alias[0]), False))


def _with_alias(args: argparse.Namespace, k, value):
    """``value`` of knob ``k``, or the value its shorthand flag means when that flag was given (``--chunked-ce`` is
    ``--loss chunked``); the shorthand beside a contradicting value is an input error naming it (a switch left off
    contradicts nothing)."""
    if not alias_given(args, k):
        return value
    flag, meant = k.cli.alias
    if value not in (None, meant) and not (k.is_switch and value is False):
        raise AdvisorInputError(flag, f"is {k.flag} {format_value(meant)}, which contradicts {k.flag} {value}", value)
    return meant


def _alias_dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_gpus_flags(p: argparse.ArgumentParser) -> None:
    from advisor.memory.sharding import DEFAULT_SHARDING, STRATEGIES

    g = p.add_argument_group("several GPUs")
    g.add_argument("--gpus", type=positive_int, default=1, help="data-parallel GPUs (per-GPU ledger)")
    g.add_argument("--sharding", choices=STRATEGIES, default=DEFAULT_SHARDING,
                   help="how model state is split across --gpus (ZeRO-2/3, FSDP full shard, or replicated)")


def range_type(r):
    """The argparse type of a Range (advisor.core.knobs): whole numbers from its low, else numbers in it."""
    if r.whole:
        return whole_number(int(r.low))
    return number(low=r.low, low_inclusive=r.low_inclusive, high=r.high)


def add_setting_flags(p, settings_cls: type) -> None:
    """A flag per study setting that declares one (advisor.search.setting): its help, parse type, choices
    and the default the help states."""
    from advisor.search.setting import NO_DEFAULT, settings_of

    g = p.add_argument_group("study settings")
    for s in settings_of(settings_cls):
        if s.flag is None:
            continue
        options = {k: v for k, v in s.cli.items() if k != "range"}
        if "range" in s.cli:
            options["type"] = range_type(s.cli["range"])
        options.setdefault("help", s.help)
        if options.get("action") not in ("store_true", "store_false") and "default" not in options:
            plain = s.default is not NO_DEFAULT and s.resolve is None and not isinstance(s.default, (dict, list))
            options["default"] = s.default if plain else None
        g.add_argument(s.flag, **options)


def add_plan_override_flags(p: argparse.ArgumentParser, plan: type = Plan) -> None:
    """A flag per knob of ``plan``, as estimate takes it (flag, parse type, choices), that fixes the knob in the
    search space (``plan_overrides``); left out, the space searches it."""
    g = p.add_argument_group("fix a knob of the space (the flags of advisor estimate; the same as key=value)")
    for k in knobs(plan):
        options: dict[str, Any] = {"dest": k.name, "default": None,
                                   "help": k.help + " (default: the space's)"}
        if k.is_switch:
            g.add_argument(k.flag, action="store_const", const=True, **options)
        else:
            if k.choices is not None and k.cli.parse is None:
                options["choices"] = k.choices
                if _whole_choices(k):
                    options["type"] = int
            if k.cli.parse is not None and k.choices is not None:
                options["type"] = k.cli.parse  # a word the knob's own parse reads (--task train is sft)
            elif k.cli.parse is not None:
                options["type"] = str  # kept as typed: the space reads set names and module lists itself
            elif k.range is not None:
                options["type"] = range_type(k.range)
            if k.cli.metavar:
                options["metavar"] = k.cli.metavar
            if k.cli.repeat:  # each flag one more value of the tuple (--image-size 1024x768 --image-size 640x480)
                options["action"] = "append"
            g.add_argument(k.flag, **options)
        add_alias_flag(g, k)


def plan_overrides(args: argparse.Namespace, overrides: list[str] | tuple[str, ...] = (),
                   plan: type = Plan) -> list[str]:
    """The ``key=value`` space overrides the knob flags given ask for (``add_plan_override_flags``): each fixes
    its knob to one value; a flag that contradicts an override of the same key, or a knob the space derives
    from its other values, is an input error naming the flag."""
    from advisor.search.space import known_fixed_keys, search_knobs

    given = {o.split("=", 1)[0].strip() for o in overrides}
    out: list[str] = []
    for k in knobs(plan):
        value = getattr(args, k.name, None)
        value = _with_alias(args, k, value)
        if value is None:
            continue
        if k.name not in search_knobs(plan) and k.name not in known_fixed_keys(plan):
            raise AdvisorInputError(k.flag, "the search space derives this knob from its other values (advisor "
                                    "estimate takes it for one plan)", value)
        if k.name in given:
            raise AdvisorInputError(k.flag, f"contradicts the override {k.name}=... given beside it", value)
        if isinstance(value, list):  # a repeated flag: the list the space's YAML reads (image_sizes=[a, b])
            text = value[0] if len(value) == 1 else "[" + ", ".join(value) + "]"
        else:
            text = "true" if value is True else format_value(value)
        out.append(f"{k.name}={text}")
        if k.cli.implies and value != k.default and k.cli.implies[0] not in given:
            implied, implied_value = k.cli.implies
            out.append(f"{implied}={'true' if implied_value is True else format_value(implied_value)}")
        if k.cli.alias_implies and alias_given(args, k):
            implied, implied_value = k.cli.alias_implies
            text = "true" if implied_value is True else format_value(implied_value)
            if implied in given:
                raise AdvisorInputError(k.cli.alias[0], f"implies {implied}={text}, which the override {implied}=... "
                                        "given beside it may contradict: leave one out", True)
            out.append(f"{implied}={text}")
    return out


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
        value = _with_alias(args, k, value)
        if k.cli.repeat and isinstance(value, list):
            value = tuple(value)
        values[k.name] = k.default if value is None and not k.cli.default else value
    if values.get("seq_len") == "max":  # advisor.core.plan.SEQ_MAX: a question estimate and tune answer
        raise AdvisorInputError("--seq-len", "max (the longest sequence that fits) is answered by advisor estimate "
                                "and advisor tune", "max")
    for k in knobs(plan):  # defaults that follow other knobs (the quantization follows the method)
        if k.cli.default and values[k.name] is None:
            values[k.name] = k.cli.default(values)
    for k in knobs(plan):  # a knob that turns another on (--checkpoint-layers: --gradient-checkpointing)
        if k.cli.implies and values[k.name] != k.default:
            values[k.cli.implies[0]] = k.cli.implies[1]
        if k.cli.alias_implies and alias_given(args, k):  # --checkpoint-offload: --gradient-checkpointing too
            values[k.cli.alias_implies[0]] = k.cli.alias_implies[1]
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
                          host_budget=getattr(args, "host_budget", None), gpus=getattr(args, "gpus", None) or 1,
                          **rules)


def check_plan_against_model(model, plan) -> None:
    """Model-dependent rules (LoRA targets that exist, sequence within the model's context)."""
    from advisor.core.adapters import attention_linears
    from advisor.core.plan import lora_target_modules, vision_model_problems

    lora_target_modules(plan, list(model.linear_shapes()), attention_linears(model))
    from advisor.memory.sequence_parallel import sequence_parallel_problems

    problems = vision_model_problems(plan, model.vision is not None, model.name) + sequence_parallel_problems(model,
                                                                                                            plan)
    if problems:
        raise problems[0]
    if plan.checkpoint_layers is not None and plan.checkpoint_layers > model.num_layers:
        raise AdvisorInputError("--checkpoint-layers", f"{model.name} has {model.num_layers} decoder layers",
                                plan.checkpoint_layers)
    context_problem(model, plan)


def context_problem(model, plan) -> None:
    """A sequence past the model's context (its trained context, or factor x it under --rope-scaling): a one-line
    error that names --rope-scaling and the factor that would reach it."""
    from advisor.core.rope import extend_hint, scaled_context

    trained = model.max_position_embeddings
    if not trained:
        return
    context = scaled_context(trained, plan.rope_scaling)
    said = f"{model.name}'s context of {context:,} tokens" + (
        "" if context == trained else f" ({plan.rope_scaling} x {trained:,})")
    longest = plan.max_prompt_length + plan.max_completion_length if plan.task == "grpo" else plan.seq_len
    if longest <= context:
        return
    hint = extend_hint(trained, longest)
    if plan.task == "grpo":
        raise AdvisorInputError("--max-completion-length", f"prompt + completion ({plan.max_prompt_length:,} + "
                                f"{plan.max_completion_length:,}) is longer than {said}; {hint}",
                                plan.max_completion_length)
    raise AdvisorInputError("--seq-len", f"longer than {said}; {hint}", plan.seq_len)


def add_study_flags(p: argparse.ArgumentParser) -> None:
    """STUDY or --storage/--study, as advisor.search.locate.resolve_storage reads them (report, export)."""
    p.add_argument("study", nargs="?", metavar="STUDY",
                   help="study folder holding study.db (reports/<study>/), its study.db, or a study name under "
                        "--reports-dir")
    p.add_argument("--storage", help="Optuna storage URL instead of STUDY (e.g. postgresql://user@host/db)")
    p.add_argument("--study", dest="study_name", metavar="NAME",
                   help="study name inside the storage (needed when it holds more than one)")
    p.add_argument("--reports-dir", default="reports", help="where a bare STUDY name is looked up")
