"""Read a training config back into a Plan: the inverse of ``advisor.configs.export``.

``read_config(path)`` understands

- ``advisor.yaml`` as ``advisor export`` writes it (sections ``model``, ``quantization``, ``lora``,
  ``training``, ``deepspeed``, ``advisor``);
- the same sections without the ``advisor`` one, in YAML or JSON (a hand-written HF setup), or a
  flat ``TrainingArguments`` JSON/YAML with ``model`` / ``quantization`` / ``lora`` /
  ``deepspeed`` sections (or ``model_name_or_path``) beside its keys;
- axolotl YAML (``base_model``, ``adapter``, ``micro_batch_size``, ...);
- LLaMA-Factory YAML (``model_name_or_path`` with ``finetuning_type`` / ``stage`` / ``cutoff_len``);
- TRL's flat trl.yaml (SFTConfig + ModelConfig keys).

Each format is read by the module that writes it (its declaration's ``reader``, advisor.configs.formats), the keys
the knobs declare for it by advisor.configs._keys. What runs is what is
read: for advisor.yaml the Plan comes from the library sections, not from the ``advisor.plan`` copy;
where a section and ``advisor.plan`` disagree (someone edited the file), ``extras["edited"]`` says which
fields. Values a file leaves out take the default of the tool that would run it, and
``extras["defaulted"]`` lists them.

Files are parsed with ``yaml.safe_load`` / ``json.loads`` only. Every problem is reported at once
(``ConfigErrors``), each naming its key (``training.optim``, ``lora_target``...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from advisor.configs._base import Collect, load_mapping
from advisor.configs._keys import error_keys
from advisor.configs.formats import FORMATS as DECLARED, detect_format, readable, resolve
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.knobs import knobs
from advisor.core.plan import Plan, canonical

# FORMATS is served by the module __getattr__ below (PEP 562), which ruff does not see
__all__ = ["read_config", "detect_format", "load_mapping", "canonical", "FORMATS"]  # noqa: F822


def __getattr__(name: str):
    if name == "FORMATS":  # the formats read, from their declarations (advisor.configs.formats)
        return tuple(readable())
    raise AttributeError(name)


def read_config(path: str | Path, *, check_fields: bool = True,
                plan: type = Plan) -> tuple[str, Plan, dict[str, Any]]:
    """(model name or path, Plan, extras) from an advisor.yaml, HF, axolotl, LLaMA-Factory or TRL config.

    extras: ``format``; ``file`` (the mapping as parsed); ``defaulted`` (keys the file left out, filled with the
    tool's default);
    ``edited`` ({field: [advisor.plan value, value read]} where advisor.yaml's sections were changed);
    ``prediction`` / ``gpu`` / ``gpus`` / ``sharding`` (from advisor.yaml); ``sections`` (advisor/hf: the raw sections).
    ``check_fields`` (advisor/hf formats): report keys that TrainingArguments / LoraConfig /
    BitsAndBytesConfig do not have (imports transformers and peft). ``plan``: the Plan class read into
    (its declared knobs are the keys read).
    Raises AdvisorInputError / ConfigErrors naming every bad key at once.
    """
    p = Path(path)
    data = load_mapping(p)
    fmt = detect_format(data)
    c = Collect(p.resolve().parent)
    declared = DECLARED[fmt]
    name, f, extras = resolve(declared.reader)(data, c, plan)
    if check_fields and declared.check is not None:
        resolve(declared.check)(c, data, extras)
    result = None
    if not c.errors:
        result = canonical(plan(**{k: v for k, v in f.items() if v is not None}))
        keys = error_keys(plan, declared.keys or fmt)
        flag_field = {k.flag: k.name for k in knobs(plan)}
        for e in result.problems():
            field = flag_field.get(e.where, e.where)
            c.errors.append(AdvisorInputError(keys.get(field, field), e.rule, e.value))
    if c.errors:
        raise c.errors[0] if len(c.errors) == 1 else ConfigErrors(c.errors)
    extras["format"] = fmt
    extras["file"] = data  # the mapping as parsed, for checks that read a key the plan has no field for
    extras["defaulted"] = c.defaulted
    extras["sequence_counts_images"] = declared.sequence_counts_images
    extras.setdefault("sharding", _sharding_of(extras))
    if "advisor_plan" in extras:
        try:
            recorded = plan.from_dict(extras["advisor_plan"])
        except (AdvisorInputError, TypeError):
            recorded = None
        if recorded is not None:
            mine, theirs = result.to_dict(), canonical(recorded).to_dict()
            extras["edited"] = {k: [theirs[k], mine[k]] for k in mine if mine[k] != theirs[k]}
    return name, _with_shell_allocator(result, extras), extras


def _sharding_of(extras: dict[str, Any]) -> str | None:
    """How the file splits model state across its GPUs where it does not say so itself (advisor.yaml's
    ``advisor.sharding`` does): TrainingArguments' ``fsdp`` option, or a DeepSpeed config's ZeRO stage without CPU
    offload (advisor.configs._deepspeed.sharding_of); None: replicated, or one GPU."""
    from advisor.configs._deepspeed import sharding_of

    sections = extras.get("sections") or {}
    fsdp = extras.get("fsdp") or (sections.get("training") or {}).get("fsdp")
    return "fsdp" if fsdp else sharding_of(extras.get("deepspeed") or sections.get("deepspeed"))


ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def _with_shell_allocator(plan: Plan, extras: dict[str, Any]) -> Plan:
    """The plan with the allocator setting of this shell's ``PYTORCH_CUDA_ALLOC_CONF``, where it is set: torch reads
    it when CUDA starts, over what a file says (train.py lets the shell's value win over advisor.yaml's ``env``), and
    TRL's, axolotl's and LLaMA-Factory's files have no field for it (their headers say to set it in the shell)."""
    value = os.environ.get(ALLOC_ENV)
    if not value or "expandable_segments" not in {k.name for k in knobs(type(plan))}:
        return plan
    from advisor.memory.allocator import AllocatorConfig

    conf = AllocatorConfig.from_env(value)  # a value torch would reject: an error naming it
    extras["shell_env"] = {ALLOC_ENV: value}
    return plan if plan.expandable_segments == conf.expandable_segments else \
        plan.with_(expandable_segments=conf.expandable_segments)
