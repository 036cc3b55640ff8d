"""What runs on a card: the one rule of which plans a GPU (and a model's class) can run.

Every hardware rule is data in ``advisor/data/card_rules.yaml``, each with its source: bf16 only from
Ampere (sm80) on, FlashAttention-2 only there too, FlashAttention-3 only on Hopper (sm90), Triton kernels
(Liger, torchao's low-bit AdamW) from sm70, bitsandbytes from sm60; and what runs but by a slower path (LLM.int8()
without int8 tensor cores, the grouped-GEMM experts fallback), said but never refused. The model side, which attention
implementations transformers runs for the model's class, is an input (``model_facts``).

Used by plan validation (the tuner's Conditions through ``advisor.search.space.model_rules``; estimate and
probe), the search space (its ``auto`` choices, ``Card.choice``), pre-flight and the exports, so the
search never proposes, and pre-flight never refuses, a plan the other one judges differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from advisor.core.data_files import load_data_file
from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import knob_of
from advisor.core.plan import ATTENTION, Plan

AUTO = "auto"
"""A search space's choice for a knob the card decides (``CARD_DECIDED``): the value ``Card.choice`` gives."""
CARD_DECIDED = ("precision", "attn_impl")
"""The knobs whose ``auto`` choice the card (and the model) decide: the precision the card trains in, the
attention implementation the model's class runs."""
CARD_DEFAULT_MEANS = {
    "precision": "the card's: bf16 on Ampere or newer, else fp16 with loss scaling (mixed_fp16 for --method full)",
    "attn_impl": "sdpa where the model's class runs it, else eager",
}
"""What an ``auto`` choice (a flag left out) means, in the words of --help."""
BF16_RULE = "bf16-unsupported"
"""The rule that says which cards have bf16 tensor cores (``card_precision`` follows it)."""


# --------------------------------------------------------------------------- the rules (data)


@dataclass(frozen=True)
class CardRule:
    """One requirement of lever values on the GPU (an entry of card_rules.yaml's ``rules``)."""

    id: str
    name: str
    """What needs it, as a finding's title says it."""
    when: Mapping[str, tuple]
    """Plan knob → the values concerned; ``experts``: a model with routed experts."""
    sm_below: int | None
    """Cards below this compute capability are concerned (a requirement)."""
    sm_from: int | None
    """Cards from this compute capability on are concerned (a better choice the card has)."""
    effect: str
    """refuse (not valid on those cards) or note (runs; said, never refused)."""
    lacks: str
    """What the cards concerned lack or do, completing "the Tesla T4 (sm75) ..."."""
    instead: str
    """What to use there, in the command line's words."""
    fix: str
    """The same in a config file's words (pre-flight)."""
    source: str
    detail: str = ""
    """More on what happens there (pre-flight's evidence)."""
    sm_not_in: tuple[int, ...] = ()
    """Cards whose compute capability is none of these are concerned (a kernel built for one architecture only)."""

    def on(self, gpu: Any) -> bool:
        """Does the rule concern this card? A card of unknown compute capability is judged only by its bf16
        flag (bf16 from sm80 on: below or at/above the bf16 rule's bound); with no card, never."""
        if gpu is None:
            return False
        low, high = _sm_range(gpu)
        if self.sm_not_in:  # concerned when it cannot be any of them (unknown: only where its range excludes them)
            return not any(low <= sm <= high for sm in self.sm_not_in)
        if self.sm_below is not None:
            return high < self.sm_below
        return self.sm_from is not None and low >= self.sm_from

    def covers(self, knob: str, value: Any) -> bool:
        return value in self.when.get(knob, ())

    def says(self, gpu: Any) -> str:
        """The one line after the flag: "the Tesla T4 (sm75) has no bf16 tensor cores; use fp16 (...)"."""
        said = f"{card_label(gpu)} {self.lacks}"
        return f"{said}; use {self.instead}" if self.effect == "refuse" else said


@lru_cache(maxsize=None)
def card_rules() -> tuple[CardRule, ...]:
    """The rules of advisor/data/card_rules.yaml."""
    return tuple(CardRule(id=r["id"], name=r["name"], when={k: tuple(v) if isinstance(v, list) else (v,)
                                                             for k, v in r["when"].items()},
                          sm_below=r.get("sm_below"), sm_from=r.get("sm_from"), effect=r["effect"],
                          lacks=r["lacks"], instead=r["instead"], fix=r["fix"], source=r["source"],
                          detail=r.get("detail", ""), sm_not_in=tuple(r.get("sm_not_in", ())))
                 for r in load_data_file("card_rules.yaml")["rules"])


@lru_cache(maxsize=None)
def not_card_rules() -> tuple[dict, ...]:
    """The lever values checked and found to need nothing of the GPU, each with why and its source."""
    return tuple(load_data_file("card_rules.yaml")["not_card_rules"])


def card_sm(gpu: Any) -> int | None:
    """The card's compute capability (major * 10 + minor), None when unknown."""
    return getattr(gpu, "sm", None)


def _sm_range(gpu: Any) -> tuple[int, float]:
    """The compute capabilities the card may have: its own, or, unknown, what its bf16 flag says."""
    sm = card_sm(gpu)
    if sm is not None:
        return sm, sm
    bound = next(r.sm_below for r in card_rules() if r.id == BF16_RULE)
    return (bound, float("inf")) if getattr(gpu, "bf16", True) else (0, bound - 1)


def card_label(gpu: Any) -> str:
    """"the Tesla T4 (sm75)", as the rules' messages name a card."""
    sm = card_sm(gpu)
    return f"the {gpu.name}" + (f" (sm{sm})" if sm is not None else "")


def bf16_runs(gpu: Any) -> bool:
    """The card has bf16 tensor cores (the bf16 rule does not refuse bf16 on it; no card: assumed)."""
    return not any(r.id == BF16_RULE and r.on(gpu) for r in card_rules())


def card_precision(gpu: Any, method: str = "lora") -> str:
    """The precision a plan takes on the card: bf16 where it has bf16 tensor cores (or no card is known), else
    fp16 trained with loss scaling. With adapters that is the Plan's ``fp16``: fp16 weights, fp16 autocast,
    fp32 adapters (peft's autocast_adapter_dtype upcasts them) and the Trainer's GradScaler (the exports write
    ``fp16: true``); a full fine-tune is ``mixed_fp16`` (fp32 master weights: pure fp16 ones diverge)."""
    if bf16_runs(gpu):
        return "bf16"
    return "mixed_fp16" if method == "full" else "fp16"


# --------------------------------------------------------------------------- the model side


@dataclass(frozen=True)
class ModelFacts:
    """What a model's class runs, as the card rules need it."""

    class_name: str | None = None
    attention: frozenset[str] | None = None
    """The attention implementations transformers runs for the class (eager always); None: not known."""
    experts: bool = False
    """The model routes tokens to experts (transformers' experts implementation applies)."""
    transformers_version: str = ""


def model_facts(model: Any) -> ModelFacts:
    """The facts of a ModelSpec's class (None, or a spec without a description: nothing known, nothing refused):
    the attention implementations its class accepts, read from the class by the meta-device build of the
    model's description (advisor.core.architecture: ``_supports_sdpa`` / ``_supports_flash_attn``)."""
    description = getattr(model, "description", None)
    if description is None:
        return ModelFacts()
    attention = frozenset(i for i in ATTENTION if description.supports_attention(i))
    return ModelFacts(class_name=description.model_class, attention=attention, experts=description.moe is not None,
                      transformers_version=description.transformers_version)


def default_attention(facts: ModelFacts) -> str:
    """The attention a plan takes for the model: sdpa where its class runs it (transformers' own default),
    else eager (flash_attention_2 needs the flash-attn package on the training machine: only when asked)."""
    return "sdpa" if facts.attention is None or "sdpa" in facts.attention else "eager"


# --------------------------------------------------------------------------- judging a plan


@dataclass(frozen=True)
class CardFinding:
    """What a rule says about one plan on one card."""

    id: str
    effect: str
    """refuse or note."""
    knob: str | None
    """The Plan knob it concerns (None: the model's experts)."""
    value: Any
    rule: str
    """The one line a command prints after the flag: what the card lacks and what to use instead."""
    title: str
    """Pre-flight's title."""
    fix: str
    evidence: str
    """What happens there and where the rule comes from."""

    def error(self, plan_type: type | None = None) -> AdvisorInputError:
        flag = knob_of(plan_type or Plan, self.knob).flag if self.knob else "--model"
        return AdvisorInputError(flag, self.rule, self.value)


@dataclass(frozen=True)
class Card:
    """Where a plan will train: the GPU (None: not known, nothing is refused for it) and the model's facts.

    A search space bound to it resolves its ``auto`` choices (``choice``); its ``problems`` are the card's part
    of a plan's validation."""

    gpu: Any = None
    model: ModelFacts = ModelFacts()

    @classmethod
    def of(cls, gpu: Any = None, model: Any = None) -> "Card":
        return cls(gpu, model_facts(model))

    def choice(self, knob: str, values: Mapping[str, Any]) -> Any:
        """The value an ``auto`` choice of ``knob`` takes at a point of the space (``values``: the knobs so far)."""
        if knob == "precision":
            return card_precision(self.gpu, values.get("method", "lora"))
        if knob == "attn_impl":
            return default_attention(self.model)
        raise KeyError(f"{knob} is not decided by the card (CARD_DECIDED: {', '.join(CARD_DECIDED)})")

    def refusal(self, knob: str, value: Any) -> str | None:
        """Why ``value`` of ``knob`` cannot run here whatever the other knobs (None: it may run), in one line."""
        if value == AUTO:
            return None  # the card's own choice
        rule = next((r for r in card_rules() if r.effect == "refuse" and r.covers(knob, value) and r.on(self.gpu)),
                    None)
        if rule is not None:
            return rule.says(self.gpu)
        if knob == "attn_impl":
            return next((f.rule for f in self._attention_findings(value)), None)
        return None

    def findings(self, plan: Any) -> list[CardFinding]:
        """Everything the rules say about ``plan`` here: refusals and notes."""
        values = vars(plan)
        out: list[CardFinding] = []
        for r in card_rules():
            if not r.on(self.gpu):
                continue
            label = card_label(self.gpu)
            evidence = f"{r.detail} ({r.source})" if r.detail else r.source
            if r.when.get("experts") and self.model.experts:
                out.append(CardFinding(r.id, r.effect, None, self.model.class_name, r.says(self.gpu),
                                       f"{r.name} on {label}", r.fix, evidence))
            for knob, concerned in r.when.items():
                if knob == "experts" or values.get(knob) not in concerned:
                    continue
                if not knob_of(type(plan), knob).applies_to(values):
                    continue
                title = (f"{r.name} requested but {label} {r.lacks}" if r.effect == "refuse"
                         else f"{r.name} on {label}: it {r.lacks}")
                out.append(CardFinding(r.id, r.effect, knob, values[knob], r.says(self.gpu), title, r.fix, evidence))
        out += self._attention_findings(plan.attn_impl)
        return out

    def _attention_findings(self, impl: str) -> list[CardFinding]:
        facts = self.model
        if facts.attention is None or impl in facts.attention:
            return []
        runs = sorted(facts.attention, key=["sdpa", "flash_attention_2", "flash_attention_3", "eager"].index)
        attrs = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn",
                 "flash_attention_3": "_supports_flash_attn"}.get(impl, "?")
        where = f"transformers {facts.transformers_version}".strip()
        rule = (f"{facts.class_name} does not run {impl} in {where} ({attrs} is False); use "
                f"{' or '.join(runs)}")
        return [CardFinding("attention-unsupported", "refuse", "attn_impl", impl, rule,
                            f"{impl} requested but {facts.class_name} does not support it",
                            f"use attn_implementation: {runs[0]}",
                            "transformers modeling_utils.PreTrainedModel._sdpa_can_dispatch / "
                            "_flash_attn_can_dispatch: ValueError when the class's attribute is False")]

    def problems(self, plan: Any) -> list[AdvisorInputError]:
        """The plan's rules on this card: one error per refusal, naming the flag and the value."""
        return [f.error(type(plan)) for f in self.findings(plan) if f.effect == "refuse"]

    def notes(self, plan: Any) -> list[CardFinding]:
        """What runs, but by a slower path or with a better choice at hand."""
        return [f for f in self.findings(plan) if f.effect == "note"]


def card_problems(plan: Any, gpu: Any, model: Any = None) -> list[AdvisorInputError]:
    """Every rule of what runs that ``plan`` breaks on ``gpu`` (None: no card known) for ``model`` (a ModelSpec;
    None: its class is not judged), one AdvisorInputError each (flag, what the card lacks, what to use)."""
    return Card.of(gpu, model).problems(plan)


# --------------------------------------------------------------------------- gpt-oss's MXFP4 experts


@lru_cache(maxsize=None)
def mxfp4_rule() -> dict:
    """card_rules.yaml ``mxfp4``: which checkpoints ship MXFP4 experts and where transformers keeps them."""
    return dict(load_data_file("card_rules.yaml")["mxfp4"])


def ships_mxfp4(model: Any) -> bool:
    """The model's checkpoint holds its experts in MXFP4 (its type, or its config's quantization_config)."""
    config = getattr(model, "config", None) or {}
    quant = (config.get("quantization_config") or {}) if isinstance(config, dict) else {}
    return getattr(model, "model_type", None) in mxfp4_rule()["model_types"] or quant.get("quant_method") == "mxfp4"


def mxfp4_kept(model: Any, gpu: Any, *, training: bool, kernels: bool = True) -> bool:
    """Whether transformers keeps the MXFP4 experts of ``model`` in MXFP4 in memory: never for training
    (is_trainable is False); for inference on a card of compute capability >= ``sm_from`` with Triton and
    ``kernels`` installed (``kernels``: whether the serving machine has them; unknown card: not kept)."""
    if not ships_mxfp4(model) or training or not kernels:
        return False
    sm = card_sm(gpu)
    return sm is not None and sm >= int(mxfp4_rule()["sm_from"])


def mxfp4_training_note(model: Any, plan: Any) -> str | None:
    """The ledger's note for a training plan of a model whose checkpoint ships MXFP4 experts (None: not one)."""
    if not ships_mxfp4(model):
        return None
    rule = mxfp4_rule()
    what = ("the experts are bf16 stacks, the attention 4/8-bit, loaded from a bf16 copy of the checkpoint (a "
            "BitsAndBytesConfig on the MXFP4 checkpoint raises ValueError)" if getattr(plan, "quantized", False)
            else "weights in bf16")
    return (f"{rule['name']}: the checkpoint's MXFP4 experts are dequantized to bf16 at load, because transformers "
            f"cannot train MXFP4 (Mxfp4HfQuantizer.is_trainable is False; MXFP4 is kept only for inference on "
            f"sm{rule['sm_from']}+ with {rule['needs']}): {what}")


__all__ = ["AUTO", "CARD_DECIDED", "CARD_DEFAULT_MEANS", "Card", "CardFinding", "CardRule", "ModelFacts", "bf16_runs",
           "card_label", "card_precision", "card_problems", "card_rules", "card_sm", "default_attention", "model_facts",
           "mxfp4_kept", "mxfp4_rule", "mxfp4_training_note", "not_card_rules", "ships_mxfp4"]
