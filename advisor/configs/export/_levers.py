"""How each export format says the levers of issue 15: the optimizer implementation and its knobs, the step
inside backward, checkpointing k of L layers, activation offload. One function per format, each returning
the keys to add, or raising Unsupported with the reason (a format never approximates a lever).

Field names, checked against each tool's documentation:
- TrainingArguments (transformers 5): ``optim`` (OptimizerNames), ``optim_target_modules`` and ``optim_args``
  ("rank=…,update_proj_gap=…", read by trainer_optimizer._get_galore_optimizer / _get_apollo_optimizer),
  ``gradient_checkpointing_kwargs`` (alias of ``activation_checkpointing_kwargs``) with ``every_n_layers``
  and ``offload`` (Trainer pops both before torch.utils.checkpoint; modeling_utils
  ``activation_checkpointing_enable``).
- axolotl: ``optimizer``, ``optim_args``, ``optim_target_modules``, ``activation_offloading``
  (docs/config-reference.qmd; tests/data/axolotl_fields.txt).
- LLaMA-Factory: ``optim``; ``use_galore`` / ``galore_target`` / ``galore_rank`` / ``galore_update_interval`` /
  ``galore_layerwise`` and ``use_apollo`` / ``apollo_target`` / ``apollo_rank`` / ``apollo_update_interval``
  (src/llamafactory/hparams/finetuning_args.py GaloreArguments, ApolloArguments; the GaLore optimizer class
  follows ``optim``: adamw_torch → GaLoreAdamW, adamw_8bit → GaLoreAdamW8bit, trainer_utils._create_galore_optimizer).
"""

from __future__ import annotations

from typing import Any

from advisor.configs.export._base import Unsupported
from advisor.core.plan import LOW_RANK_OPTIMIZERS, checkpointed_layers, every_n_layers

GALORE_TARGETS = ["self_attn", "mlp"]
"""optim_target_modules: every decoder-layer linear (advisor.runtime.build.GALORE_TARGETS)."""


def optim_args(plan) -> str:
    return f"rank={plan.optim_rank},update_proj_gap={plan.optim_proj_gap}"


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


def advisor_fields(plan, spec) -> dict[str, Any]:
    """advisor.yaml's advisor keys: what TrainingArguments has no field for, applied by train.py."""
    return {"checkpoint_layers": plan.checkpoint_layers if plan.gradient_checkpointing else None,
            "activation_offload": bool(plan.activation_offload),
            "optimizer_in_backward": bool(plan.optimizer_in_backward)}


def _no_in_backward(fmt: str, plan) -> None:
    if plan.optimizer_in_backward:
        raise Unsupported(fmt, "it has no optimizer step inside backward (torchtune optimizer_in_bwd); "
                               "use lomo/adalomo, or the advisor.yaml + train.py export")


def _all_layers_only(fmt: str, plan, spec) -> None:
    if plan.gradient_checkpointing and plan.checkpoint_layers is not None \
            and len(checkpointed_layers(plan, spec.num_layers)) < spec.num_layers:
        raise Unsupported(fmt, f"it checkpoints every layer or none; checkpointing {plan.checkpoint_layers} of "
                               f"{spec.num_layers} layers needs the advisor.yaml + train.py export")


def axolotl_fields(plan, spec) -> dict[str, Any]:
    _no_in_backward("axolotl", plan)
    _all_layers_only("axolotl", plan, spec)
    out: dict[str, Any] = {}
    if plan.optimizer in LOW_RANK_OPTIMIZERS:
        out["optim_target_modules"] = list(GALORE_TARGETS)
        out["optim_args"] = optim_args(plan)
    if plan.activation_offload:
        if plan.gradient_checkpointing:
            raise Unsupported("axolotl", "its activation_offloading offloads every activation; the plan offloads "
                                         "only the checkpointed layer inputs (use the advisor.yaml export)")
        out["activation_offloading"] = True
    return out


LF_GALORE_OPTIM = {"galore_adamw": "adamw_torch", "galore_adamw_8bit": "adamw_8bit",
                   "galore_adamw_layerwise": "adamw_torch"}


def llamafactory_fields(plan, spec) -> dict[str, Any]:
    _no_in_backward("llamafactory", plan)
    _all_layers_only("llamafactory", plan, spec)
    if plan.activation_offload:
        raise Unsupported("llamafactory", "it has no activation offloading key")
    out: dict[str, Any] = {}
    if plan.optimizer.startswith("galore"):
        out.update(optim=LF_GALORE_OPTIM[plan.optimizer], use_galore=True, galore_target="all",
                   galore_rank=plan.optim_rank, galore_update_interval=plan.optim_proj_gap,
                   galore_layerwise=plan.optimizer.endswith("layerwise"))
    elif plan.optimizer == "apollo_adamw":
        out.update(optim="adamw_torch", use_apollo=True, apollo_target="all", apollo_rank=plan.optim_rank,
                   apollo_update_interval=plan.optim_proj_gap)
    return out


def trl_fields(plan, spec) -> dict[str, Any]:
    """SFTConfig keys (TrainingArguments' plus TRL's ``activation_offloading``, trl/trainer/sft_config.py).

    Checkpointed-input offload is TrainingArguments' ``gradient_checkpointing_kwargs.offload``; offload
    without checkpointing is TRL's own ``activation_offloading`` (OffloadActivations around the loss)."""
    _no_in_backward("trl", plan)
    out = {k: v for k, v in training_arguments_fields(plan, spec).items()}
    if plan.gradient_checkpointing and plan.checkpoint_layers is not None \
            and len(checkpointed_layers(plan, spec.num_layers)) < spec.num_layers and every_n(plan, spec) is None:
        raise Unsupported("trl", f"checkpointing {plan.checkpoint_layers} of {spec.num_layers} layers is not every "
                                 "n-th layer (gradient_checkpointing_kwargs.every_n_layers); use the advisor.yaml "
                                 "+ train.py export")
    if plan.activation_offload and not plan.gradient_checkpointing:
        out["activation_offloading"] = True
    return out
