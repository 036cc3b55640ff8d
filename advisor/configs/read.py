"""Read a training config back into a Plan: the inverse of ``advisor.configs.export``.

``read_config(path)`` understands

- ``advisor.yaml`` as ``advisor export`` writes it (sections ``model``, ``quantization``, ``lora``,
  ``training``, ``deepspeed``, ``advisor``);
- the same sections without the ``advisor`` one, in YAML or JSON (a hand-written HF setup), or a
  flat ``TrainingArguments`` JSON/YAML with ``model`` / ``quantization`` / ``lora`` /
  ``deepspeed`` sections (or ``model_name_or_path``) beside its keys;
- axolotl YAML (``base_model``, ``adapter``, ``micro_batch_size``, ...);
- LLaMA-Factory YAML (``model_name_or_path`` with ``finetuning_type`` / ``stage`` / ``cutoff_len``).

What runs is what is read: for advisor.yaml the Plan comes from the library sections, not from
the ``advisor.plan`` copy; fields the libraries have no key for (sequence length, chunked loss)
come from the ``advisor`` section. Where a section and ``advisor.plan`` disagree (someone edited
the file), ``extras["edited"]`` says which fields. Values a file leaves out take the default of
the tool that would run it, and ``extras["defaulted"]`` lists them.

Files are parsed with ``yaml.safe_load`` / ``json.loads`` only. Every problem is reported at once
(``ConfigErrors``), each naming its key (``training.optim``, ``lora_target``...).
"""

from __future__ import annotations

import json
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Any

import yaml

from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.plan import ALL_LINEAR, Plan, flag_of

__all__ = ["read_config", "detect_format", "load_mapping", "canonical", "FORMATS"]

FORMATS = ("advisor", "hf", "axolotl", "llamafactory", "trl")
TRL_MARKERS = ("use_peft", "dataset_text_field", "max_length", "packing_strategy", "lora_target_modules")
TRL_MODEL_KEYS = {"model_name_or_path", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha",
                  "lora_dropout", "lora_target_modules", "use_dora", "load_in_4bit", "load_in_8bit",
                  "bnb_4bit_quant_type", "use_bnb_nested_quant", "lora_task_type", "use_rslora", "trust_remote_code",
                  "model_revision", "lora_modules_to_save", "lora_target_parameters", "bnb_4bit_quant_storage"}

TORCH_TO_PLAN = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16",
                 "fp32": "fp32", "half": "fp16", "float": "fp32", "torch.bfloat16": "bf16",
                 "torch.float16": "fp16", "torch.float32": "fp32"}
# (weights dtype, bf16 autocast, fp16 autocast) → precision; see advisor/configs/export/_base.py
FLAGS_PRECISION = {("bf16", True, False): "bf16", ("fp16", False, True): "fp16", ("fp32", False, False): "fp32",
                   ("fp32", True, False): "mixed_bf16", ("fp32", False, True): "mixed_fp16",
                   ("bf16", False, False): "bf16", ("fp16", False, False): "fp16"}
OPTIM_ALIASES = {
    # each name is read as itself: adamw_torch_fused is the fused kernel, not foreach adamw_torch (issue 15);
    # adamw_bnb_8bit is transformers' other name for the same bitsandbytes class as adamw_8bit
    "adamw_torch": "adamw_torch", "adamw_torch_fused": "adamw_torch_fused", "adamw_hf": "adamw_torch",
    "adamw_torch_8bit": "adamw_torch_8bit", "adamw_torch_4bit": "adamw_torch_4bit",
    "galore_adamw": "galore_adamw", "galore_adamw_8bit": "galore_adamw_8bit",
    "galore_adamw_layerwise": "galore_adamw_layerwise", "apollo_adamw": "apollo_adamw",
    "lomo": "lomo", "adalomo": "adalomo",
    "adamw_8bit": "adamw_8bit", "adamw_bnb_8bit": "adamw_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit", "paged_adamw_32bit": "paged_adamw_32bit",
    "adafactor": "adafactor", "sgd": "sgd",
}
ATTN = {"sdpa": "sdpa", "eager": "eager", "flash_attention_2": "flash_attention_2"}
HF_TRAINING_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
                        "optim": "adamw_torch_fused"}  # TrainingArguments.optim's default in transformers 5
TRAINING_MARKERS = ("per_device_train_batch_size", "gradient_accumulation_steps", "output_dir", "optim")
_FLAG_FIELD = {flag_of(f.name): f.name for f in dc_fields(Plan)}


# --------------------------------------------------------------------------- loading


def canonical(plan: Plan) -> Plan:
    """The plan with the fields that do not apply to it at their defaults (LoRA knobs of a full
    fine-tune, 4-bit knobs of an unquantized plan): two plans that train the same way compare equal."""
    d = Plan()
    changes: dict[str, Any] = {}
    if not plan.peft:
        changes.update(lora_r=d.lora_r, lora_alpha=d.lora_alpha, lora_dropout=d.lora_dropout,
                       lora_targets=d.lora_targets)
    if not plan.four_bit:
        changes.update(double_quant=False, compute_dtype=d.compute_dtype)
    from advisor.core.plan import LOW_RANK_OPTIMIZERS

    if plan.optimizer not in LOW_RANK_OPTIMIZERS:
        changes.update(optim_rank=d.optim_rank, optim_proj_gap=d.optim_proj_gap)
    return plan.with_(**changes) if changes else plan



def load_mapping(path: str | Path) -> dict[str, Any]:
    """The file as a dict: JSON for .json, YAML (safe_load) otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise AdvisorInputError("CONFIG", f"cannot read {p} ({e.strerror})", str(p), show_value=False) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise AdvisorInputError("CONFIG", f"{p} is not valid JSON ({e.msg} at line {e.lineno})", str(p),
                                show_value=False) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise AdvisorInputError("CONFIG", f"{p} is not valid YAML{where}", str(p), show_value=False) from None
    if not isinstance(data, dict):
        raise AdvisorInputError("CONFIG", f"{p} must hold a mapping of keys to values", str(p), show_value=False)
    return data


def detect_format(data: dict[str, Any]) -> str:
    """advisor | hf | axolotl | llamafactory, from the keys a file uses."""
    if isinstance(data.get("training"), dict):
        return "advisor" if isinstance(data.get("advisor"), dict) else "hf"
    if "base_model" in data or "micro_batch_size" in data or "sequence_len" in data:
        return "axolotl"
    if "model_name_or_path" in data and any(k in data for k in ("finetuning_type", "stage", "cutoff_len")):
        return "llamafactory"
    if "model_name_or_path" in data and any(k in data for k in TRL_MARKERS):
        return "trl"
    if any(k in data for k in TRAINING_MARKERS):
        return "hf"
    raise AdvisorInputError(
        "CONFIG", "cannot tell the format: expected advisor.yaml sections (model, training, ...), TrainingArguments "
        "keys, an axolotl config (base_model) or a LLaMA-Factory config (model_name_or_path + finetuning_type)",
        sorted(data)[:8], show_value=False)


# --------------------------------------------------------------------------- helpers


class _Collect:
    """Reads values, records each problem with its key, and what was defaulted."""

    def __init__(self, base_dir: Path):
        self.errors: list[AdvisorInputError] = []
        self.defaulted: list[str] = []
        self.base_dir = base_dir

    def bad(self, where: str, rule: str, value: Any) -> None:
        self.errors.append(AdvisorInputError(where, rule, value))

    def section(self, data: dict, key: str, where: str | None = None) -> dict | None:
        value = data.get(key)
        if value is None or value == {}:
            return None
        if not isinstance(value, dict):
            self.bad(where or key, "must be a mapping of keys to values (or null)", value)
            return None
        return value

    def get(self, data: dict, key: str, where: str, kind: str, default: Any = None, *, record: bool = True) -> Any:
        if key not in data or data[key] is None:
            if record and default is not None:
                self.defaulted.append(where)
            return default
        value = data[key]
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                self.bad(where, "must be a whole number", value)
                return default
            return int(value)
        if kind == "num":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                try:
                    return float(str(value))
                except ValueError:
                    self.bad(where, "must be a number", value)
                    return default
            return value
        if kind == "bool":
            if not isinstance(value, bool):
                self.bad(where, "must be true or false", value)
                return default
            return value
        if kind == "str":
            if not isinstance(value, str) or not value:
                self.bad(where, "must be a non-empty string", value)
                return default
            return value
        return value

    def choice(self, value: Any, table: dict[str, str], where: str) -> str | None:
        if value is None:
            return None
        key = str(value).strip()
        if key not in table:
            self.bad(where, f"must be one of {', '.join(dict.fromkeys(table))}", value)
            return None
        return table[key]

    def deepspeed(self, value: Any, where: str) -> tuple[str, dict | None]:
        """offload mode from a DeepSpeed config dict or a path to its JSON (relative to the config file)."""
        if value in (None, "", False):
            return "none", None
        ds = value
        if isinstance(value, str):
            p = Path(value)
            p = p if p.is_absolute() else self.base_dir / p
            try:
                ds = json.loads(p.read_text(encoding="utf-8"))
            except OSError:
                self.bad(where, f"names {p}, which cannot be read", value)
                return "none", None
            except json.JSONDecodeError as e:
                self.bad(where, f"{p} is not valid JSON ({e.msg} at line {e.lineno})", value)
                return "none", None
        if not isinstance(ds, dict):
            self.bad(where, "must be a DeepSpeed config (a mapping) or the path to its JSON", value)
            return "none", None
        zero = ds.get("zero_optimization") or {}
        stage = zero.get("stage", 0)
        dev = lambda k: (zero.get(k) or {}).get("device", "none")  # noqa: E731
        if stage == 2 and dev("offload_optimizer") == "cpu" and dev("offload_param") in ("none", None):
            return "zero2_cpu", ds
        if stage == 3 and dev("offload_optimizer") == "cpu" and dev("offload_param") == "cpu":
            return "zero3_cpu", ds
        self.bad(f"{where}.zero_optimization",
                 "the advisor plans ZeRO-2 with offload_optimizer on the cpu, or ZeRO-3 with offload_param and "
                 "offload_optimizer on the cpu", {"stage": stage, "offload_optimizer": dev("offload_optimizer"),
                                                  "offload_param": dev("offload_param")})
        return "none", ds

    def targets(self, value: Any, where: str, *, comma: bool = False) -> tuple[str, ...] | str | None:
        if value is None:
            return None
        if isinstance(value, str):
            if value.strip() in (ALL_LINEAR, "all"):
                return ALL_LINEAR
            if comma or value.replace("_", "").replace(",", "").replace(" ", "").isalnum():
                names = tuple(t.strip() for t in value.split(",") if t.strip())
                if names:
                    return names
            self.bad(where, f"a regular expression is not supported here: list the module names or {ALL_LINEAR}",
                     value)
            return None
        if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) and t for t in value):
            return tuple(value)
        self.bad(where, f"must be a list of module names or {ALL_LINEAR}", value)
        return None


def _unknown_keys(c: _Collect, section: dict | None, where: str, allowed: set[str] | None) -> None:
    if section is None or allowed is None:
        return
    for key in section:
        if key not in allowed:
            c.bad(f"{where}.{key}" if where else key, "is not a field of the class this section is passed to", section[key])


def _class_fields(kind: str) -> set[str] | None:
    """Field names of TrainingArguments / LoraConfig / BitsAndBytesConfig, from the installed libraries."""
    import dataclasses
    import inspect

    try:
        if kind == "training":
            from transformers import TrainingArguments

            return {f.name for f in dataclasses.fields(TrainingArguments)}
        if kind == "lora":
            from peft import LoraConfig

            return {f.name for f in dataclasses.fields(LoraConfig)}
        if kind == "quantization":
            from transformers import BitsAndBytesConfig

            return set(inspect.signature(BitsAndBytesConfig.__init__).parameters) - {"self", "kwargs"}
    except ImportError:
        return None
    return None


# --------------------------------------------------------------------------- per format


def _read_hf(data: dict, c: _Collect, fmt: str) -> tuple[str | None, dict, dict]:
    """advisor.yaml / HF sections / flat TrainingArguments → (model, plan fields, extras)."""
    extras: dict[str, Any] = {}
    if fmt == "hf" and not isinstance(data.get("training"), dict):
        training = {k: v for k, v in data.items() if k not in ("model", "quantization", "lora", "deepspeed_config",
                                                              "model_name_or_path", "max_seq_length", "advisor")}
        sect = ""
    else:
        training = c.section(data, "training") or {}
        sect = "training."
    model = c.section(data, "model") or {}
    name = None
    for key in ("name_or_path", "pretrained_model_name_or_path", "model_name_or_path"):
        if model.get(key):
            name = c.get(model, key, f"model.{key}", "str")
            break
    if name is None and data.get("model_name_or_path"):
        name = c.get(data, "model_name_or_path", "model_name_or_path", "str")
    if name is None:
        c.bad("model.name_or_path", "the model to train is required", None)

    dtype_key = "torch_dtype" if "torch_dtype" in model else "dtype"
    wdtype = c.choice(model.get(dtype_key, "float32"), TORCH_TO_PLAN, f"model.{dtype_key}")
    if dtype_key not in model:
        c.defaulted.append("model.torch_dtype")
    attn = c.choice(model.get("attn_implementation", "sdpa"), ATTN, "model.attn_implementation")
    if "attn_implementation" not in model:
        c.defaulted.append("model.attn_implementation")

    f: dict[str, Any] = {}
    bf16 = c.get(training, "bf16", f"{sect}bf16", "bool", False, record=False)
    fp16 = c.get(training, "fp16", f"{sect}fp16", "bool", False, record=False)
    if bf16 and fp16:
        c.bad(f"{sect}fp16", "bf16 and fp16 autocast cannot both be on", fp16)
    elif wdtype:
        prec = FLAGS_PRECISION.get((wdtype, bool(bf16), bool(fp16)))
        if prec is None:
            c.bad(f"{sect}{'bf16' if bf16 else 'fp16'}",
                  f"{'bf16' if bf16 else 'fp16'} autocast over {wdtype} weights is not a precision the advisor plans",
                  True)
        else:
            f["precision"] = prec
    f["attn_impl"] = attn
    f["micro_batch"] = c.get(training, "per_device_train_batch_size", f"{sect}per_device_train_batch_size", "int",
                             HF_TRAINING_DEFAULTS["per_device_train_batch_size"])
    f["grad_accum"] = c.get(training, "gradient_accumulation_steps", f"{sect}gradient_accumulation_steps", "int", 1,
                            record=False)
    ckpt_key = "activation_checkpointing" if "activation_checkpointing" in training else "gradient_checkpointing"
    f["gradient_checkpointing"] = c.get(training, ckpt_key, f"{sect}{ckpt_key}", "bool", False, record=False)
    f["optimizer"] = c.choice(training.get("optim", HF_TRAINING_DEFAULTS["optim"]), OPTIM_ALIASES, f"{sect}optim")
    if "optim" not in training:
        c.defaulted.append(f"{sect}optim")
    _read_levers_hf(data, training, sect, name, c, f)

    ds_value = training.get("deepspeed")
    ds_where = f"{sect}deepspeed"
    if ds_value is None and isinstance(data.get("deepspeed"), dict):
        ds_value, ds_where = data["deepspeed"], "deepspeed"
    f["offload"], ds = c.deepspeed(ds_value, ds_where)
    if ds:
        for ds_key, t_key, default in (("train_micro_batch_size_per_gpu", "per_device_train_batch_size", f["micro_batch"]),
                                       ("gradient_accumulation_steps", "gradient_accumulation_steps", f["grad_accum"])):
            v = ds.get(ds_key)
            if isinstance(v, int) and not isinstance(v, bool) and default is not None and v != default:
                c.bad(f"deepspeed.{ds_key}", f"must equal {sect}{t_key} ({default}), or be \"auto\"", v)

    quant = c.section(data, "quantization")
    f["quantization"], f["double_quant"], f["compute_dtype"] = "none", False, "bf16"
    if quant:
        q4 = c.get(quant, "load_in_4bit", "quantization.load_in_4bit", "bool", False, record=False)
        q8 = c.get(quant, "load_in_8bit", "quantization.load_in_8bit", "bool", False, record=False)
        if q4 and q8:
            c.bad("quantization.load_in_8bit", "load_in_4bit and load_in_8bit cannot both be true", q8)
        elif q4:
            qt = quant.get("bnb_4bit_quant_type", "fp4")  # BitsAndBytesConfig's default
            if "bnb_4bit_quant_type" not in quant:
                c.defaulted.append("quantization.bnb_4bit_quant_type")
            f["quantization"] = c.choice(qt, {"nf4": "nf4", "fp4": "fp4"}, "quantization.bnb_4bit_quant_type")
            f["double_quant"] = c.get(quant, "bnb_4bit_use_double_quant", "quantization.bnb_4bit_use_double_quant",
                                      "bool", False, record=False)
            cd = quant.get("bnb_4bit_compute_dtype", "float32")  # BitsAndBytesConfig's default
            if "bnb_4bit_compute_dtype" not in quant:
                c.defaulted.append("quantization.bnb_4bit_compute_dtype")
            f["compute_dtype"] = c.choice(cd, TORCH_TO_PLAN, "quantization.bnb_4bit_compute_dtype")
        elif q8:
            f["quantization"] = "int8"

    lora = c.section(data, "lora")
    if lora:
        f["method"] = "qlora" if f["quantization"] in ("nf4", "fp4") else "lora"
        f["lora_r"] = c.get(lora, "r", "lora.r", "int", 8)
        f["lora_alpha"] = float(c.get(lora, "lora_alpha", "lora.lora_alpha", "num", 8))
        f["lora_dropout"] = float(c.get(lora, "lora_dropout", "lora.lora_dropout", "num", 0.0))
        t = c.targets(lora.get("target_modules"), "lora.target_modules")
        if lora.get("target_modules") is None:
            c.bad("lora.target_modules", f"is required: list the module names or {ALL_LINEAR} (peft's per-model "
                  "default is not guessed)", None)
        f["lora_targets"] = t
    else:
        f["method"] = "full"

    advisor = c.section(data, "advisor") or {}
    seq = None
    for where_d, key in ((advisor, "max_seq_length"), (training, "max_seq_length"), (training, "max_length"),
                         (data, "max_seq_length")):
        if key in where_d:
            seq = c.get(where_d, key, key if where_d is data else
                        (f"advisor.{key}" if where_d is advisor else f"{sect}{key}"), "int")
            break
    if seq is None:
        seq = 1024
        c.defaulted.append("max_seq_length")
    f["seq_len"] = seq
    f.update(_hf_levers(advisor, training, lora, c, sect))
    env = advisor.get("env") if isinstance(advisor.get("env"), dict) else {}
    if env.get("PYTORCH_CUDA_ALLOC_CONF"):
        from advisor.memory.allocator import AllocatorConfig

        try:
            conf = AllocatorConfig.from_env(str(env["PYTORCH_CUDA_ALLOC_CONF"]))
        except AdvisorInputError as e:
            raise AdvisorInputError("advisor.env.PYTORCH_CUDA_ALLOC_CONF", e.rule, env["PYTORCH_CUDA_ALLOC_CONF"]) from None
        f["expandable_segments"] = conf.expandable_segments
    for key in ("prediction", "gpu"):
        if key in advisor:
            extras[key] = advisor[key]
    if isinstance(advisor.get("plan"), dict):
        extras["advisor_plan"] = advisor["plan"]
    extras["sections"] = {"model": model, "quantization": quant, "lora": lora, "training": training,
                          "deepspeed": ds}
    return name, f, extras


def _hf_levers(advisor: dict, training: dict, lora: dict | None, c: _Collect, sect: str) -> dict[str, Any]:
    """loss / dora / packing from advisor.yaml's advisor section, TrainingArguments' Liger flags and
    LoraConfig.use_dora (the ``chunked_ce`` key of files written before the loss knob is read too)."""
    from advisor.core.plan import LOSSES

    out: dict[str, Any] = {}
    if "loss" in advisor:
        out["loss"] = c.choice(advisor.get("loss"), {k: k for k in LOSSES}, "advisor.loss")
    elif c.get(advisor, "chunked_ce", "advisor.chunked_ce", "bool", False, record=False):
        out["loss"] = "chunked"
    elif training.get("use_liger_kernel") and (training.get("liger_kernel_config") or {}).get(
            "fused_linear_cross_entropy", True):
        out["loss"] = "fused-linear"  # Trainer applies Liger's fused linear cross-entropy (its default: on)
    else:
        out["loss"] = "plain"
    out["dora"] = bool(c.get(lora or {}, "use_dora", "lora.use_dora", "bool", False, record=False)) if lora else False
    out["packing"] = c.get(advisor, "packing", "advisor.packing", "bool", False, record=False)
    return out


def _trl_as_sections(data: dict) -> dict:
    """A flat trl.yaml (SFTConfig + ModelConfig keys, as ``trl sft --config`` reads it) as advisor.yaml-style
    sections: ModelConfig's model / quantization / LoRA keys, the rest TrainingArguments (trl get_peft_config,
    get_quantization_config: the 4-bit compute dtype is ``dtype``)."""
    dtype = data.get("dtype") or "float32"
    model = {"name_or_path": data.get("model_name_or_path"), "torch_dtype": dtype,
             "attn_implementation": data.get("attn_implementation") or "sdpa"}
    quant = None
    if data.get("load_in_4bit"):
        quant = {"load_in_4bit": True, "bnb_4bit_quant_type": data.get("bnb_4bit_quant_type", "nf4"),
                 "bnb_4bit_use_double_quant": bool(data.get("use_bnb_nested_quant")), "bnb_4bit_compute_dtype": dtype}
    elif data.get("load_in_8bit"):
        quant = {"load_in_8bit": True}
    lora = None
    if data.get("use_peft"):
        lora = {"r": data.get("lora_r", 16), "lora_alpha": data.get("lora_alpha", 32),
                "lora_dropout": data.get("lora_dropout", 0.05), "target_modules": data.get("lora_target_modules"),
                "use_dora": bool(data.get("use_dora"))}  # ModelConfig's defaults
    training = {k: v for k, v in data.items() if k not in TRL_MODEL_KEYS and k not in
                ("max_length", "packing", "packing_strategy", "padding_free", "dataset_text_field", "loss_type")}
    advisor = {"max_seq_length": data.get("max_length", 1024), "packing": bool(data.get("packing"))}
    if training.pop("activation_offloading", False):
        advisor["activation_offload"] = True  # TRL's own offload (without checkpointing)
    return {"model": model, "quantization": quant, "lora": lora, "training": training, "advisor": advisor}


def _read_axolotl(data: dict, c: _Collect) -> tuple[str | None, dict, dict]:
    f: dict[str, Any] = {}
    name = c.get(data, "base_model", "base_model", "str")
    if name is None:
        c.bad("base_model", "the model to train is required", None)
    adapter = data.get("adapter") or None
    q4 = c.get(data, "load_in_4bit", "load_in_4bit", "bool", False, record=False)
    q8 = c.get(data, "load_in_8bit", "load_in_8bit", "bool", False, record=False)
    bf16 = data.get("bf16", "auto")
    if bf16 == "auto":
        c.defaulted.append("bf16")  # axolotl picks bf16 where the GPU has it
        bf16 = True
    fp16 = c.get(data, "fp16", "fp16", "bool", False, record=False)
    bf16 = bool(bf16) or bool(data.get("bfloat16"))
    fp16 = bool(fp16) or bool(data.get("float16"))
    if bf16 and fp16:
        c.bad("fp16", "bf16 and fp16 cannot both be on", True)
    f["precision"] = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    act = f["precision"]
    f["method"], f["quantization"], f["double_quant"], f["compute_dtype"] = "full", "none", False, "bf16"
    if adapter not in (None, "lora", "qlora"):
        c.bad("adapter", "must be lora, qlora or empty (full fine-tuning)", adapter)
    elif adapter == "qlora" or (adapter == "lora" and q4):
        if adapter == "lora" and q4:
            c.bad("adapter", "axolotl quantizes to 4 bits only with adapter: qlora", adapter)
        bnb = data.get("bnb_config_kwargs") or {}
        f["method"] = "qlora"
        f["quantization"] = c.choice(bnb.get("bnb_4bit_quant_type", "nf4"), {"nf4": "nf4", "fp4": "fp4"},
                                     "bnb_config_kwargs.bnb_4bit_quant_type")
        f["double_quant"] = c.get(bnb, "bnb_4bit_use_double_quant", "bnb_config_kwargs.bnb_4bit_use_double_quant",
                                  "bool", True, record=False)  # axolotl's default: on
        f["compute_dtype"] = c.choice(bnb.get("bnb_4bit_compute_dtype", {"bf16": "bfloat16", "fp16": "float16",
                                                                         "fp32": "float32"}[act]),
                                      TORCH_TO_PLAN, "bnb_config_kwargs.bnb_4bit_compute_dtype")
        if not q4:
            c.bad("load_in_4bit", "adapter: qlora needs load_in_4bit: true", q4)
    elif adapter == "lora":
        f["method"] = "lora"
        f["quantization"] = "int8" if q8 else "none"
    elif q4 or q8:
        c.bad("adapter", "load_in_4bit / load_in_8bit need an adapter (axolotl refuses them for full fine-tuning)",
              adapter)
    if f["method"] != "full":
        f["lora_r"] = c.get(data, "lora_r", "lora_r", "int", 8)
        f["lora_alpha"] = float(c.get(data, "lora_alpha", "lora_alpha", "num", 16))
        f["lora_dropout"] = float(c.get(data, "lora_dropout", "lora_dropout", "num", 0.0, record=False))
        if data.get("lora_target_linear"):
            f["lora_targets"] = ALL_LINEAR
        else:
            f["lora_targets"] = c.targets(data.get("lora_target_modules"), "lora_target_modules")
            if data.get("lora_target_modules") is None:
                c.bad("lora_target_modules", "is required unless lora_target_linear: true", None)
    f["seq_len"] = c.get(data, "sequence_len", "sequence_len", "int", 512)
    f["micro_batch"] = c.get(data, "micro_batch_size", "micro_batch_size", "int", 1)
    f["grad_accum"] = c.get(data, "gradient_accumulation_steps", "gradient_accumulation_steps", "int", 1,
                            record=False)
    gc = data.get("gradient_checkpointing", False)
    if gc not in (True, False, None):
        c.bad("gradient_checkpointing", "only true/false are planned (offloaded checkpoints are not)", gc)
    f["gradient_checkpointing"] = bool(gc is True)
    f["optimizer"] = c.choice(data.get("optimizer", "adamw_torch_fused"), OPTIM_ALIASES, "optimizer")
    if "optimizer" not in data:
        c.defaulted.append("optimizer")
    _read_levers_axolotl(data, c, f)
    attn = data.get("attn_implementation")
    if attn is None:
        attn = ("flash_attention_2" if data.get("flash_attention") else "eager" if data.get("eager_attention")
                else "sdpa")
    f["attn_impl"] = c.choice(attn, ATTN, "attn_implementation")
    f["loss"] = ("fused-linear" if data.get("liger_fused_linear_cross_entropy") or data.get("cut_cross_entropy")
                 else "chunked" if data.get("chunked_cross_entropy") else "plain")
    f["dora"] = bool(data.get("peft_use_dora")) and f["method"] != "full"
    f["packing"] = bool(data.get("sample_packing"))
    f["offload"], _ = c.deepspeed(data.get("deepspeed"), "deepspeed")
    return name, f, {}


def _read_llamafactory(data: dict, c: _Collect) -> tuple[str | None, dict, dict]:
    f: dict[str, Any] = {}
    name = c.get(data, "model_name_or_path", "model_name_or_path", "str")
    if name is None:
        c.bad("model_name_or_path", "the model to train is required", None)
    ft = data.get("finetuning_type", "lora")  # LLaMA-Factory's default
    if ft not in ("lora", "full"):
        c.bad("finetuning_type", "the advisor plans lora and full (not freeze or oft)", ft)
    bits = data.get("quantization_bit")
    f["quantization"], f["double_quant"] = "none", False
    if bits is not None:
        if data.get("quantization_method", "bnb") not in ("bnb", "bitsandbytes"):
            c.bad("quantization_method", "only bitsandbytes (bnb) quantization is planned",
                  data.get("quantization_method"))
        if bits == 4:
            f["quantization"] = c.choice(data.get("quantization_type", "nf4"), {"nf4": "nf4", "fp4": "fp4"},
                                         "quantization_type")
            f["double_quant"] = c.get(data, "double_quantization", "double_quantization", "bool", True, record=False)
        elif bits == 8:
            f["quantization"] = "int8"
        else:
            c.bad("quantization_bit", "bitsandbytes quantization is 4 or 8 bits", bits)
    bf16 = c.get(data, "bf16", "bf16", "bool", False, record=False)
    fp16 = c.get(data, "fp16", "fp16", "bool", False, record=False)
    pure = c.get(data, "pure_bf16", "pure_bf16", "bool", False, record=False)
    full = ft == "full"
    if bf16 and fp16:
        c.bad("fp16", "bf16 and fp16 cannot both be on", True)
    elif pure:
        f["precision"] = "bf16"
    elif bf16:
        f["precision"] = "mixed_bf16" if full else "bf16"
    elif fp16:
        f["precision"] = "mixed_fp16" if full else "fp16"
    else:
        c.bad("bf16", "set bf16 or fp16: without them LLaMA-Factory picks the dtype itself", None)
    act = (f.get("precision") or "bf16").replace("mixed_", "")
    f["compute_dtype"] = act if f["quantization"] in ("nf4", "fp4") else "bf16"
    f["method"] = "full" if full else ("qlora" if f["quantization"] in ("nf4", "fp4") else "lora")
    if not full:
        f["lora_r"] = c.get(data, "lora_rank", "lora_rank", "int", 8)
        alpha = c.get(data, "lora_alpha", "lora_alpha", "num", None)
        f["lora_alpha"] = float(alpha if alpha is not None else 2 * (f["lora_r"] or 8))  # LF: rank * 2
        f["lora_dropout"] = float(c.get(data, "lora_dropout", "lora_dropout", "num", 0.0, record=False))
        f["lora_targets"] = c.targets(data.get("lora_target", "all"), "lora_target", comma=True)
    f["seq_len"] = c.get(data, "cutoff_len", "cutoff_len", "int", 2048)
    f["micro_batch"] = c.get(data, "per_device_train_batch_size", "per_device_train_batch_size", "int", 8)
    f["grad_accum"] = c.get(data, "gradient_accumulation_steps", "gradient_accumulation_steps", "int", 1,
                            record=False)
    f["gradient_checkpointing"] = not c.get(data, "disable_gradient_checkpointing", "disable_gradient_checkpointing",
                                            "bool", False, record=False)
    f["optimizer"] = c.choice(data.get("optim", HF_TRAINING_DEFAULTS["optim"]), OPTIM_ALIASES, "optim")
    _read_levers_llamafactory(data, c, f)
    f["attn_impl"] = c.choice(data.get("flash_attn", "auto"),
                              {"auto": "sdpa", "sdpa": "sdpa", "disabled": "eager", "fa2": "flash_attention_2"},
                              "flash_attn")
    f["loss"] = "fused-linear" if data.get("enable_liger_kernel") else "plain"
    f["dora"] = bool(data.get("use_dora")) and not full
    f["packing"] = bool(data.get("packing"))
    f["offload"], _ = c.deepspeed(data.get("deepspeed"), "deepspeed")
    return name, f, {}


# --------------------------------------------------------------------------- levers of issue 15


def _optim_args(text: Any, where: str, c: _Collect, f: dict) -> None:
    """optim_args "rank=128,update_proj_gap=200" → optim_rank / optim_proj_gap (trainer_optimizer's parser)."""
    if text in (None, ""):
        return
    if not isinstance(text, str):
        c.bad(where, 'must be a string like "rank=128,update_proj_gap=200"', text)
        return
    for part in text.replace(" ", "").split(","):
        key, _, value = part.partition("=")
        field = {"rank": "optim_rank", "update_proj_gap": "optim_proj_gap"}.get(key)
        if field is None:
            continue  # scale, proj_type...: no memory effect
        if not value.isdigit() or int(value) < 1:
            c.bad(where, f"{key} must be a whole number of at least 1", value)
        else:
            f[field] = int(value)


def _layers_of(name: str | None) -> int | None:
    """Decoder layers of a catalog model (for every_n_layers), without reaching the network."""
    if not name:
        return None
    from advisor.core.catalog import model_catalog

    lowered = str(name).strip().lower()
    for key, entry in model_catalog().items():
        if lowered in (key, entry["hf_id"].lower(), *(a.lower() for a in entry.get("aliases", []))):
            return int(entry["config"]["num_hidden_layers"])
    return None


def _read_levers_hf(data: dict, training: dict, sect: str, name: str | None, c: _Collect, f: dict) -> None:
    """optim_args, checkpointing kwargs (every_n_layers, offload) and the advisor section's lever keys."""
    _optim_args(training.get("optim_args"), f"{sect}optim_args", c, f)
    advisor = data.get("advisor") if isinstance(data.get("advisor"), dict) else {}
    kw_key = "activation_checkpointing_kwargs" if "activation_checkpointing_kwargs" in training \
        else "gradient_checkpointing_kwargs"
    kwargs = training.get(kw_key) or {}
    if not isinstance(kwargs, dict):
        c.bad(f"{sect}{kw_key}", "must be a mapping", kwargs)
        kwargs = {}
    f["activation_offload"] = bool(kwargs.get("offload")) or c.get(
        advisor, "activation_offload", "advisor.activation_offload", "bool", False, record=False)
    f["optimizer_in_backward"] = c.get(advisor, "optimizer_in_backward", "advisor.optimizer_in_backward", "bool",
                                       False, record=False)
    k = advisor.get("checkpoint_layers")
    if k is not None:
        f["checkpoint_layers"] = c.get(advisor, "checkpoint_layers", "advisor.checkpoint_layers", "int", None,
                                       record=False)
        f["gradient_checkpointing"] = True
    elif kwargs.get("every_n_layers") not in (None, 1):
        n = kwargs["every_n_layers"]
        layers = _layers_of(name)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            c.bad(f"{sect}{kw_key}.every_n_layers", "must be a whole number of at least 1", n)
        elif layers is None:
            c.bad(f"{sect}{kw_key}.every_n_layers", "needs the model's layer count: name a catalog model, or set "
                  "advisor.checkpoint_layers", n)
        else:
            f["checkpoint_layers"] = len(range(0, layers, n))


def _read_levers_axolotl(data: dict, c: _Collect, f: dict) -> None:
    _optim_args(data.get("optim_args"), "optim_args", c, f)
    offload = data.get("activation_offloading", False)
    if offload not in (True, False, None):
        c.bad("activation_offloading", "only true/false are planned (legacy / disk offload are not)", offload)
    f["activation_offload"] = offload is True


LF_GALORE = {"adamw_torch": "galore_adamw", "adamw_torch_fused": "galore_adamw", "adamw_8bit": "galore_adamw_8bit"}


def _read_levers_llamafactory(data: dict, c: _Collect, f: dict) -> None:
    """use_galore / use_apollo with their rank and interval (LLaMA-Factory defaults: rank 16, every 200 steps)."""
    _optim_args(data.get("optim_args"), "optim_args", c, f)
    if c.get(data, "use_galore", "use_galore", "bool", False, record=False):
        layerwise = c.get(data, "galore_layerwise", "galore_layerwise", "bool", False, record=False)
        base = LF_GALORE.get(f.get("optimizer") or "")
        if base is None:
            c.bad("optim", "GaLore in LLaMA-Factory runs with optim adamw_torch or adamw_8bit", f.get("optimizer"))
            return
        f["optimizer"] = "galore_adamw_layerwise" if layerwise and base == "galore_adamw" else base
        f["optim_rank"] = c.get(data, "galore_rank", "galore_rank", "int", 16)
        f["optim_proj_gap"] = c.get(data, "galore_update_interval", "galore_update_interval", "int", 200)
    elif c.get(data, "use_apollo", "use_apollo", "bool", False, record=False):
        f["optimizer"] = "apollo_adamw"
        f["optim_rank"] = c.get(data, "apollo_rank", "apollo_rank", "int", 16)
        f["optim_proj_gap"] = c.get(data, "apollo_update_interval", "apollo_update_interval", "int", 200)


# Plan field → the key a person edits, per format (for the rules Plan.problems() checks).
_KEYS = {
    "advisor": {"method": "lora", "quantization": "quantization", "double_quant": "quantization.bnb_4bit_use_double_quant",
                "compute_dtype": "quantization.bnb_4bit_compute_dtype", "precision": "training.bf16",
                "lora_r": "lora.r", "lora_alpha": "lora.lora_alpha", "lora_dropout": "lora.lora_dropout",
                "lora_targets": "lora.target_modules", "gradient_checkpointing": "training.gradient_checkpointing",
                "optimizer": "training.optim", "micro_batch": "training.per_device_train_batch_size",
                "grad_accum": "training.gradient_accumulation_steps", "seq_len": "advisor.max_seq_length",
                "attn_impl": "model.attn_implementation", "offload": "training.deepspeed",
                "loss": "advisor.loss", "dora": "lora.use_dora", "packing": "advisor.packing",
                                "checkpoint_layers": "advisor.checkpoint_layers",
                "activation_offload": "advisor.activation_offload",
                "optimizer_in_backward": "advisor.optimizer_in_backward", "optim_rank": "training.optim_args",
                "optim_proj_gap": "training.optim_args", "expandable_segments": "advisor.env.PYTORCH_CUDA_ALLOC_CONF"},
    "axolotl": {"method": "adapter", "quantization": "load_in_4bit", "double_quant": "bnb_config_kwargs",
                "compute_dtype": "bnb_config_kwargs", "precision": "bf16", "lora_r": "lora_r",
                "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout", "lora_targets": "lora_target_modules",
                "gradient_checkpointing": "gradient_checkpointing", "optimizer": "optimizer",
                "micro_batch": "micro_batch_size", "grad_accum": "gradient_accumulation_steps",
                "seq_len": "sequence_len", "attn_impl": "attn_implementation", "offload": "deepspeed",
                "loss": "chunked_cross_entropy", "dora": "peft_use_dora", "packing": "sample_packing",
                                "activation_offload": "activation_offloading",
                "optim_rank": "optim_args", "optim_proj_gap": "optim_args"},
    "llamafactory": {"method": "finetuning_type", "quantization": "quantization_bit",
                     "double_quant": "double_quantization", "compute_dtype": "bf16", "precision": "bf16",
                     "lora_r": "lora_rank", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
                     "lora_targets": "lora_target", "gradient_checkpointing": "disable_gradient_checkpointing",
                     "optimizer": "optim", "micro_batch": "per_device_train_batch_size",
                     "grad_accum": "gradient_accumulation_steps", "seq_len": "cutoff_len", "attn_impl": "flash_attn",
                     "offload": "deepspeed", "loss": "enable_liger_kernel", "dora": "use_dora",
                     "packing": "packing",
                                          "optim_rank": "galore_rank",
                     "optim_proj_gap": "galore_update_interval"},
}
_KEYS["hf"] = _KEYS["advisor"]
_KEYS["trl"] = {"method": "use_peft", "quantization": "load_in_4bit", "double_quant": "use_bnb_nested_quant",
                "compute_dtype": "dtype", "precision": "bf16", "lora_r": "lora_r", "lora_alpha": "lora_alpha",
                "lora_dropout": "lora_dropout", "lora_targets": "lora_target_modules",
                "gradient_checkpointing": "gradient_checkpointing", "optimizer": "optim",
                "micro_batch": "per_device_train_batch_size", "grad_accum": "gradient_accumulation_steps",
                "seq_len": "max_length", "attn_impl": "attn_implementation", "offload": "deepspeed",
                "loss": "loss_type", "dora": "use_dora", "packing": "packing"}


def read_config(path: str | Path, *, check_fields: bool = True) -> tuple[str, Plan, dict[str, Any]]:
    """(model name or path, Plan, extras) from an advisor.yaml, HF, axolotl or LLaMA-Factory config.

    extras: ``format``; ``defaulted`` (keys the file left out, filled with the tool's default);
    ``edited`` ({field: [advisor.plan value, value read]} where advisor.yaml's sections were changed);
    ``prediction`` / ``gpu`` (from advisor.yaml); ``sections`` (advisor/hf: the raw sections).
    ``check_fields`` (advisor/hf formats): report keys that TrainingArguments / LoraConfig /
    BitsAndBytesConfig do not have (imports transformers and peft).
    Raises AdvisorInputError / ConfigErrors naming every bad key at once.
    """
    p = Path(path)
    data = load_mapping(p)
    fmt = detect_format(data)
    c = _Collect(p.resolve().parent)
    if fmt in ("advisor", "hf"):
        name, f, extras = _read_hf(data, c, fmt)
        if check_fields:
            secs = extras["sections"]
            _unknown_keys(c, secs["training"], "training" if isinstance(data.get("training"), dict) else "",
                          _class_fields("training"))
            _unknown_keys(c, secs["lora"], "lora", _class_fields("lora"))
            _unknown_keys(c, secs["quantization"], "quantization", _class_fields("quantization"))
    elif fmt == "trl":
        name, f, extras = _read_hf(_trl_as_sections(data), c, "hf")
        f["loss"] = "fused-linear"  # TRL's SFTTrainer always fuses the LM head into the loss (add_fused_lm_head)
        extras.pop("sections", None)
    elif fmt == "axolotl":
        name, f, extras = _read_axolotl(data, c)
    else:
        name, f, extras = _read_llamafactory(data, c)
    plan = None
    if not c.errors:
        plan = canonical(Plan(**{k: v for k, v in f.items() if v is not None}))
        keys = _KEYS[fmt]
        for e in plan.problems():
            field = _FLAG_FIELD.get(e.where, e.where)
            c.errors.append(AdvisorInputError(keys.get(field, field), e.rule, e.value))
    if c.errors:
        raise c.errors[0] if len(c.errors) == 1 else ConfigErrors(c.errors)
    extras["format"] = fmt
    extras["defaulted"] = c.defaulted
    if "advisor_plan" in extras:
        try:
            recorded = Plan.from_dict(extras["advisor_plan"])
        except (AdvisorInputError, TypeError):
            recorded = None
        if recorded is not None:
            mine, theirs = plan.to_dict(), canonical(recorded).to_dict()
            extras["edited"] = {k: [theirs[k], mine[k]] for k in mine if mine[k] != theirs[k]}
    return name, plan, extras
