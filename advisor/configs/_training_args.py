"""The TrainingArguments keys of the optimizer's implementation and of checkpointing, written and read back:
shared by advisor.yaml's training section and TRL's SFTConfig (a TrainingArguments), and by axolotl and
LLaMA-Factory where they pass the same keys through.

Field names, checked against each tool's documentation:
- TrainingArguments (transformers 5): ``optim`` (OptimizerNames), ``optim_target_modules`` and ``optim_args``
  ("rank=…,update_proj_gap=…", read by trainer_optimizer._get_galore_optimizer / _get_apollo_optimizer),
  ``gradient_checkpointing_kwargs`` (alias of ``activation_checkpointing_kwargs``) with ``every_n_layers``
  and ``offload`` (Trainer pops both before torch.utils.checkpoint; modeling_utils
  ``activation_checkpointing_enable``).
- axolotl: ``optimizer``, ``optim_args``, ``optim_target_modules``, ``activation_offloading``
  (docs/config-reference.qmd; tests/data/axolotl_fields.txt).
- LLaMA-Factory: ``optim``, ``optim_args`` (its GaLore / APOLLO keys: advisor.configs._llamafactory).
"""

from __future__ import annotations

from typing import Any

from advisor.configs._base import HF_OPTIM_DEFAULT, OPTIM_ALIASES, TORCH_TO_PLAN, Collect, Unsupported, \
    precision_from_flags
from advisor.core.plan import LOW_RANK_OPTIMIZERS, checkpointed_layers, every_n_layers

GALORE_TARGETS = ["self_attn", "mlp"]
"""optim_target_modules: every decoder-layer linear (advisor.runtime.build.GALORE_TARGETS)."""


# --------------------------------------------------------------------------- writing


def optim_args(plan) -> str:
    """TrainingArguments.optim_args of a low-rank optimizer: its rank and projection gap, and what its sources
    recommend beside them (GaLore's fine-tuning scale: configs._base.training_hyperparameters)."""
    from advisor.configs._base import training_hyperparameters

    extra = training_hyperparameters(plan).get("optim_args") or {}
    return ",".join([f"rank={plan.optim_rank}", f"update_proj_gap={plan.optim_proj_gap}",
                     *(f"{k}={v}" for k, v in extra.items())])


def every_n(plan, spec) -> int | None:
    """TrainingArguments' every_n_layers for the plan's checkpointed layers (None: every layer or not expressible)."""
    if not plan.gradient_checkpointing or plan.checkpoint_layers is None:
        return None
    k = len(checkpointed_layers(plan, spec.num_layers))
    return every_n_layers(k, spec.num_layers) if k < spec.num_layers else None


def training_arguments_fields(plan, spec) -> dict[str, Any]:
    """TrainingArguments keys (advisor.yaml's training section; train.py applies what they cannot say)."""
    out: dict[str, Any] = {}
    if plan.optimizer in LOW_RANK_OPTIMIZERS:
        out["optim_target_modules"] = list(GALORE_TARGETS)
        out["optim_args"] = optim_args(plan)
    if plan.gradient_checkpointing:
        kwargs: dict[str, Any] = {"use_reentrant": False}
        n = every_n(plan, spec)
        if n is not None and n > 1:
            kwargs["every_n_layers"] = n
        if plan.activation_offload:
            kwargs["offload"] = True
        out["gradient_checkpointing_kwargs"] = kwargs
    return out


def all_layers_only(fmt: str, plan, spec) -> None:
    """Refuse checkpointing some of the layers in a format that checkpoints every layer or none."""
    if plan.gradient_checkpointing and plan.checkpoint_layers is not None \
            and len(checkpointed_layers(plan, spec.num_layers)) < spec.num_layers:
        raise Unsupported(fmt, f"it checkpoints every layer or none; checkpointing {plan.checkpoint_layers} of "
                               f"{spec.num_layers} layers needs the advisor.yaml + train.py export")


# --------------------------------------------------------------------------- reading


def read_optim_args(text: Any, where: str, c: Collect, f: dict) -> None:
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


def read_optimizer(training: dict, sect: str, c: Collect, f: dict) -> None:
    """optim (TrainingArguments' default when left out) and its optim_args."""
    f["optimizer"] = c.choice(training.get("optim", HF_OPTIM_DEFAULT), OPTIM_ALIASES, f"{sect}optim")
    if "optim" not in training:
        c.defaulted.append(f"{sect}optim")
    read_optim_args(training.get("optim_args"), f"{sect}optim_args", c, f)


def read_precision(model_dtype: Any, dtype_where: str, training: dict, sect: str, c: Collect, f: dict) -> None:
    """The precision from the weights' dtype (from_pretrained's) and TrainingArguments' bf16 / fp16 autocast."""
    wdtype = c.choice(model_dtype, TORCH_TO_PLAN, dtype_where)
    bf16 = c.get(training, "bf16", f"{sect}bf16", "bool", False, record=False)
    fp16 = c.get(training, "fp16", f"{sect}fp16", "bool", False, record=False)
    if bf16 and fp16:
        c.bad(f"{sect}fp16", "bf16 and fp16 autocast cannot both be on", fp16)
    elif wdtype:
        prec = precision_from_flags(wdtype, bool(bf16), bool(fp16))
        if prec is None:
            c.bad(f"{sect}{'bf16' if bf16 else 'fp16'}",
                  f"{'bf16' if bf16 else 'fp16'} autocast over {wdtype} weights is not a precision the advisor plans",
                  True)
        else:
            f["precision"] = prec


def read_checkpointing(training: dict, sect: str, c: Collect, f: dict) -> dict:
    """gradient_checkpointing (or its activation_checkpointing alias) into ``f``; its kwargs, for the levers."""
    ckpt_key = "activation_checkpointing" if "activation_checkpointing" in training else "gradient_checkpointing"
    f["gradient_checkpointing"] = c.get(training, ckpt_key, f"{sect}{ckpt_key}", "bool", False, record=False)
    kw_key = "activation_checkpointing_kwargs" if "activation_checkpointing_kwargs" in training \
        else "gradient_checkpointing_kwargs"
    kwargs = training.get(kw_key) or {}
    if not isinstance(kwargs, dict):
        c.bad(f"{sect}{kw_key}", "must be a mapping", kwargs)
        kwargs = {}
    return {"kwargs": kwargs, "where": f"{sect}{kw_key}"}


def checkpoint_layers_of(ckpt: dict, name: str | None, c: Collect, f: dict) -> None:
    """checkpoint_layers from the checkpointing kwargs' every_n_layers (needs the model's layer count)."""
    n = ckpt["kwargs"].get("every_n_layers")
    if n in (None, 1):
        return
    layers = _layers_of(name)
    where = f"{ckpt['where']}.every_n_layers"
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        c.bad(where, "must be a whole number of at least 1", n)
    elif layers is None:
        c.bad(where, "needs the model's layer count: name a catalog model, or set advisor.checkpoint_layers", n)
    else:
        f["checkpoint_layers"] = len(range(0, layers, n))


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


def liger_fused_loss(training: dict) -> bool:
    """Trainer applies Liger's fused linear cross-entropy (``use_liger_kernel``; the kernel config's default: on)."""
    return bool(training.get("use_liger_kernel")) and (training.get("liger_kernel_config") or {}).get(
        "fused_linear_cross_entropy", True)
