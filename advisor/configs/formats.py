"""The export formats, each declared once: its name, file, what it needs beside it, writer, reader, how a file
of it is recognised, and its label in the TUI.

Everything that lists formats derives from ``FORMATS``: ``export_plan`` (the writers, the files that come
along), ``read_config`` (the readers), ``detect_format``, the keys the knobs declare (advisor.configs._keys),
``advisor export --help`` and the TUI's export dialog. A new format is one ``Format(...)`` here and the module
that writes and reads it.

Writers and readers are named ``"module:function"`` (imported when a file is written or read), so the command
line's help and the TUI list the formats without importing every format module; a callable works too.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Format", "FORMATS", "detect_format", "exported", "format_names_help", "keyed", "readable", "resolve"]


@dataclass(frozen=True)
class Format:
    name: str
    """The ``--format`` value, and the name ``read_config`` reports (``extras["format"]``)."""
    filename: str | None = None
    """The file the writer writes (None: a format that is only read)."""
    label: str | None = None
    """What the TUI's export dialog shows (None: not listed)."""
    writer: str | Callable | None = None
    """``write(ctx, out_dir) -> Path`` (advisor.configs._base.Writer), or ``"module:function"``."""
    reader: str | Callable | None = None
    """``read(data, collect, plan_type) -> (model, plan fields, extras)`` (advisor.configs._base.Read)."""
    detect: Callable[[dict], bool] | None = None
    """Whether a file's mapping is of this format; formats are tried in declaration order."""
    needs: tuple[str, ...] = ()
    """Formats whose files this one names, written with it (train.py reads advisor.yaml)."""
    names_deepspeed: bool = False
    """Names deepspeed.json when the plan runs under DeepSpeed (offload, or ZeRO on several GPUs)."""
    keys: str | None = None
    """The format name the knobs' ``keys=`` use for it (advisor.core.plan); None: knobs declare none."""
    sequence_counts_images: bool = False
    """Its sequence key caps the whole sequence a sample fills, image placeholders included (TRL's max_length,
    LLaMA-Factory's cutoff_len, axolotl's sequence_len); False: the text alone (advisor.yaml's max_seq_length)."""
    check: str | Callable | None = None
    """``check(collect, data, extras)`` after reading, when fields are checked (advisor.yaml: every key is a
    field of the class its section is passed to)."""
    help: str = ""
    """One line for ``advisor export --help``."""


def _advisor(data: dict) -> bool:
    return isinstance(data.get("training"), dict) and isinstance(data.get("advisor"), dict)


def _axolotl(data: dict) -> bool:
    return "base_model" in data or "micro_batch_size" in data or "sequence_len" in data


def _llamafactory(data: dict) -> bool:
    return "model_name_or_path" in data and any(k in data for k in ("finetuning_type", "stage", "cutoff_len"))


TRL_MARKERS = ("use_peft", "dataset_text_field", "max_length", "packing_strategy", "lora_target_modules",
               "num_generations", "max_completion_length", "use_vllm", "beta", "precompute_ref_log_probs")
"""Keys of a flat TRL config (ModelConfig; SFTConfig, GRPOConfig or DPOConfig)."""
TRAINING_MARKERS = ("per_device_train_batch_size", "gradient_accumulation_steps", "output_dir", "optim")


def _trl(data: dict) -> bool:
    return "model_name_or_path" in data and any(k in data for k in TRL_MARKERS)


def _hf(data: dict) -> bool:
    return isinstance(data.get("training"), dict) or any(k in data for k in TRAINING_MARKERS)


FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("advisor", "advisor.yaml", "advisor.yaml (bitsandbytes / LoRA / TrainingArguments)",
           "advisor.configs._advisor_yaml:write", "advisor.configs._advisor_yaml:read", _advisor,
           names_deepspeed=True, keys="advisor", check="advisor.configs._advisor_yaml:unknown_keys",
           help="advisor.yaml: BitsAndBytesConfig / LoraConfig / TrainingArguments sections"),
    Format("train", "train.py", "train.py, a runnable Trainer script", "advisor.configs._train_script:write",
           needs=("advisor",), help="train.py: a runnable Trainer + peft script reading advisor.yaml"),
    Format("deepspeed", "deepspeed.json", "deepspeed.json (ZeRO plans)", "advisor.configs._deepspeed:write",
           help="deepspeed.json: plans under DeepSpeed ZeRO (CPU offload, or ZeRO on several GPUs)"),
    Format("axolotl", "axolotl.yaml", "axolotl.yaml", "advisor.configs._axolotl:write",
           "advisor.configs._axolotl:read", _axolotl, names_deepspeed=True, keys="axolotl", sequence_counts_images=True,
           help="axolotl.yaml"),
    Format("llamafactory", "llamafactory.yaml", "llamafactory.yaml", "advisor.configs._llamafactory:write",
           "advisor.configs._llamafactory:read", _llamafactory, names_deepspeed=True, keys="llamafactory",
           sequence_counts_images=True,
           help="llamafactory.yaml (LLaMA-Factory)"),
    Format("trl", "trl.yaml", "trl.yaml + train_trl.py (TRL SFTTrainer; GRPO/DPO: train_grpo.py, train_dpo.py)",
           "advisor.configs._trl:write",
           "advisor.configs._trl:read", _trl, names_deepspeed=True, keys="trl", sequence_counts_images=True,
           help="trl.yaml + train_trl.py (TRL SFTTrainer), or GRPOConfig/DPOConfig + train_grpo.py/train_dpo.py"),
    # read only: the same sections as advisor.yaml without its advisor section, or a flat TrainingArguments file
    Format("hf", reader="advisor.configs._advisor_yaml:read_hf", detect=_hf, keys="advisor",
           check="advisor.configs._advisor_yaml:unknown_keys"),
]}
"""Every format, by name. Detection tries them in this order."""


def resolve(ref: str | Callable | None) -> Callable | None:
    """A writer, reader or check: the callable itself, or the function a ``"module:function"`` names."""
    if ref is None or callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def exported() -> dict[str, Format]:
    """The formats ``advisor export`` writes, in the order written."""
    return {n: f for n, f in FORMATS.items() if f.writer is not None}


def readable() -> dict[str, Format]:
    """The formats ``read_config`` reads, in the order they are detected."""
    return {n: f for n, f in FORMATS.items() if f.reader is not None}


def keyed() -> tuple[str, ...]:
    """The format names the knobs declare keys for (advisor.yaml's serve its HF-sections form too)."""
    return tuple(dict.fromkeys(f.keys for f in FORMATS.values() if f.keys))


def format_names_help() -> str:
    """``advisor export --format``'s help: every format written, by name."""
    return ", ".join(exported())


def detect_format(data: dict[str, Any]) -> str:
    """The name of the first declared format whose ``detect`` recognises the file's keys."""
    for f in readable().values():
        if f.detect is not None and f.detect(data):
            return f.name
    from advisor.core.errors import AdvisorInputError

    raise AdvisorInputError(
        "CONFIG", "cannot tell the format: expected advisor.yaml sections (model, training, ...), TrainingArguments "
        "keys, an axolotl config (base_model), a LLaMA-Factory config (model_name_or_path + finetuning_type) or a "
        "TRL config (model_name_or_path + use_peft / max_length)",
        sorted(data)[:8], show_value=False)
