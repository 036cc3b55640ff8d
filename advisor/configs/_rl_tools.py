"""GRPO/DPO in axolotl's and LLaMA-Factory's configs: axolotl's ``rl: grpo|dpo`` with its ``trl:`` and ``vllm:``
sections, LLaMA-Factory's ``stage: dpo``; each read back. Refused, in one line naming the format, where the tool
cannot say the plan.

axolotl 0.19 (src/axolotl/utils/schemas/config.py ``rl``, ``trl``, ``vllm``, ``precompute_ref_log_probs``,
``dpo_padding_free``; schemas/trl.py TRLConfig; schemas/vllm.py VllmConfig), as its builders pass them to TRL
(core/trainers/grpo/__init__.py ``set_training_args_kwargs``, core/trainers/dpo/__init__.py):
- GRPO: ``trl.num_generations``, ``trl.max_completion_length``, ``trl.beta``, ``trl.use_vllm``, ``trl.vllm_mode``,
  ``trl.vllm_enable_sleep_mode``, ``trl.reward_funcs`` (importable names: axolotl_rewards.py beside the config),
  ``trl.generation_batch_size`` (micro_batch x GPUs x steps_per_generation; axolotl has no steps_per_generation),
  ``vllm.gpu_memory_utilization`` and ``vllm.tensor_parallel_size`` (colocate), ``vllm.max_model_len`` (which axolotl
  passes to ``axolotl vllm-serve`` only: a colocated vLLM gets TRL's default, the model's context; docs/exports.md).
- DPO: ``sequence_len`` is DPOConfig's ``max_length``; ``trl.beta``, ``precompute_ref_log_probs``,
  ``dpo_padding_free``.

LLaMA-Factory 0.9.5 (src/llamafactory/hparams/finetuning_args.py): ``stage: dpo``, ``pref_beta``, ``pref_loss:
sigmoid``; ``cutoff_len`` is the length of each of prompt + chosen and prompt + rejected. It has no GRPO stage, no
precomputed reference log-probs and no padding-free DPO batches; the reference is its own (``ref_model`` unset: the
LoRA policy with its adapter disabled, or a frozen copy of a full fine-tune: train/dpo/workflow.py create_ref_model).
"""

from __future__ import annotations

from typing import Any

from advisor.configs._base import Collect, ExportContext, Unsupported
from advisor.core.plan import DPO, GRPO, TRL_BETA, effective_beta

REWARDS_FILE = "axolotl_rewards.py"
"""The reward module an axolotl GRPO export writes beside axolotl.yaml (``trl.reward_funcs`` names it)."""
REWARD_FUNC = "axolotl_rewards.reward_function"
PROMPT_TRANSFORM = "axolotl_rewards.prompt_transform"


def _common_refusals(plan, fmt: str) -> None:
    if plan.peft and plan.reference == "copy" and (plan.task == DPO or effective_beta(vars(plan)) > 0):
        raise Unsupported(fmt, "it scores a LoRA policy's reference with its adapter disabled; a frozen copy beside "
                               "it (--reference copy) is not a setting: use --reference adapter")


# --------------------------------------------------------------------------- axolotl

def axolotl_rl(cfg: dict[str, Any], ctx: ExportContext) -> dict[str, Any]:
    """axolotl's SFT config (``cfg``) turned into its ``rl:`` config of the plan's GRPO or DPO run."""
    plan = ctx.plan
    _common_refusals(plan, "axolotl")
    out = {k: v for k, v in cfg.items() if k not in ("pad_to_sequence_len", "sample_packing")}
    trl: dict[str, Any] = {"beta": float(effective_beta(vars(plan)))}
    out["rl"] = plan.task
    if plan.task == DPO:
        if plan.reference == "precomputed":
            out["precompute_ref_log_probs"] = True
        if plan.padding_free:
            out["dpo_padding_free"] = True
        out["datasets"] = [{"path": "pairs.jsonl", "ds_type": "json", "split": "train", "type": "user_defined.default",
                            "field_prompt": "prompt", "field_chosen": "chosen", "field_rejected": "rejected",
                            "prompt_format": "{prompt}", "chosen_format": "{chosen}",
                            "rejected_format": "{rejected}"}]
        out["trl"] = trl
        return out
    if plan.activation_offload:
        raise Unsupported("axolotl", "its GRPO trainer's config has no activation offloading")
    out["sequence_len"] = plan.max_prompt_length + plan.max_completion_length
    out["datasets"] = [{"path": "prompts.jsonl", "ds_type": "json", "split": "train", "type": PROMPT_TRANSFORM}]
    trl.update({"num_generations": plan.num_generations, "max_completion_length": plan.max_completion_length,
                "reward_funcs": [REWARD_FUNC], "use_vllm": plan.generation != "transformers"})
    if plan.steps_per_generation is not None:
        trl["generation_batch_size"] = plan.micro_batch * ctx.gpus * plan.steps_per_generation
    vllm: dict[str, Any] = {}
    if plan.generation == "vllm-colocate":
        if plan.vllm_sleep == 1:
            raise Unsupported("axolotl", "TRL sleeps vLLM at level 2 only (trl.vllm_enable_sleep_mode): use "
                                         "--vllm-sleep 0 or 2")
        trl["vllm_mode"] = "colocate"
        trl["vllm_enable_sleep_mode"] = plan.vllm_sleep == 2
        vllm = {"gpu_memory_utilization": plan.vllm_gpu_memory_utilization, "tensor_parallel_size": 1,
                "max_model_len": plan.max_prompt_length + plan.max_completion_length}
    elif plan.generation == "vllm-server":
        trl["vllm_mode"] = "server"
        vllm = {"tensor_parallel_size": plan.vllm_gpus,
                "max_model_len": plan.max_prompt_length + plan.max_completion_length}
    out["trl"] = trl
    if vllm:
        out["vllm"] = vllm
    return out


def axolotl_header(ctx: ExportContext) -> list[str]:
    plan = ctx.plan
    if plan.task == GRPO:
        lines = [f"GRPO: write your reward in {REWARDS_FILE} (reward_function, marked FILL IN) and run from this "
                 "folder (axolotl imports trl.reward_funcs by name).",
                 f"datasets: prompts.jsonl, one {{\"prompt\": ...}} per line, at most {plan.max_prompt_length} tokens "
                 "(the length the plan was sized for)."]
        if plan.generation == "vllm-colocate":
            lines += ["vllm.max_model_len reaches `axolotl vllm-serve` only: a colocated vLLM starts with TRL's "
                      "default, the model's whole context,", "in the same pool (vllm.gpu_memory_utilization)."]
        if plan.generation == "vllm-server":
            lines.append(f"Start the vLLM server first on {plan.vllm_gpus} other GPU(s): axolotl vllm-serve "
                         f"{ctx.file('axolotl.yaml')}")
        return lines
    return ["DPO: datasets is pairs.jsonl, one {\"prompt\", \"chosen\", \"rejected\"} per line: replace it with your "
            "preference data.", f"sequence_len ({plan.seq_len}) is DPOConfig's max_length of each of chosen and "
            "rejected."]


REWARDS_TEMPLATE = '''"""Rewards and the prompt transform for the axolotl GRPO config beside this file (written by vram-advisor)."""


def prompt_transform(cfg, *args, **kwargs):
    """Each dataset row to {"prompt": ...}: here a "prompt" field as it is."""
    def transform(example, tokenizer=None):
        return {"prompt": example["prompt"]}

    return transform, {"remove_columns": []}


# ============================================================================ FILL IN: your reward
def reward_function(prompts, completions, **kwargs) -> list[float]:
    """FILL IN: one score per completion (higher is better); other dataset columns arrive in kwargs."""
    raise NotImplementedError("axolotl_rewards.py: write your reward in reward_function (marked FILL IN)")
# ============================================================================ end of FILL IN
'''  # noqa: E501 (the file's text as written, its first line included)


def read_axolotl_rl(data: dict, c: Collect, f: dict[str, Any]) -> None:
    """axolotl's ``rl:`` and its ``trl:`` / ``vllm:`` sections into ``f`` (before the declared keys are read)."""
    rl = data.get("rl")
    if rl in (None, "", False):
        return
    if rl not in (GRPO, DPO):
        c.bad("rl", "only grpo and dpo are planned", rl)
        return
    f["task"] = rl
    trl = c.section(data, "trl") or {}
    vllm = c.section(data, "vllm") or {}
    beta = trl.get("beta", data.get("rl_beta"))
    f["beta"] = None if beta is None or float(beta) == TRL_BETA[rl] else float(beta)
    if rl == DPO:
        f["reference"] = "precomputed" if data.get("precompute_ref_log_probs") else (
            "adapter" if f.get("method") != "full" else "copy")
        f["padding_free"] = bool(data.get("dpo_padding_free"))
        return
    if f.get("method") == "full" and effective_beta(f) > 0:
        f["reference"] = "copy"
    f.pop("seq_len", None)  # sequence_len is prompt + completion here; GRPO's seq_len is unused
    f["num_generations"] = c.get(trl, "num_generations", "trl.num_generations", "int", 8)  # TRL's default
    completion = c.get(trl, "max_completion_length", "trl.max_completion_length", "int", 512)
    f["max_completion_length"] = completion
    f["generation"] = "transformers"
    if trl.get("use_vllm"):
        mode = c.choice(trl.get("vllm_mode") or "server", {"colocate": "colocate", "server": "server"},
                        "trl.vllm_mode")  # TRL's vllm_mode default is colocate; axolotl's None sends server's host
        f["generation"] = f"vllm-{mode or 'server'}"
    if f["generation"] == "vllm-colocate":
        f["vllm_sleep"] = 2 if trl.get("vllm_enable_sleep_mode") else 0
        util = vllm.get("gpu_memory_utilization")
        if util is not None:
            f["vllm_gpu_memory_utilization"] = float(util)
    if f["generation"] == "vllm-server":
        f["vllm_gpus"] = c.get(vllm, "tensor_parallel_size", "vllm.tensor_parallel_size", "int", 1, record=False)
    longest = vllm.get("max_model_len") or data.get("sequence_len")
    if isinstance(longest, int) and completion and longest > completion:
        f["max_prompt_length"] = longest - completion
    gbs = trl.get("generation_batch_size")
    if isinstance(gbs, int) and f.get("micro_batch"):
        f["steps_per_generation"] = max(1, gbs // f["micro_batch"])


# --------------------------------------------------------------------------- LLaMA-Factory

LF_STAGES = "pt, sft, rm, ppo, dpo, kto"


def llamafactory_rl(cfg: dict[str, Any], ctx: ExportContext) -> dict[str, Any]:
    """LLaMA-Factory's SFT config (``cfg``) as its ``stage: dpo`` run; GRPO refused (it has no GRPO stage)."""
    plan = ctx.plan
    if plan.task == GRPO:
        raise Unsupported("llamafactory", f"LLaMA-Factory has no GRPO stage (its stages: {LF_STAGES}): export GRPO to "
                                          "TRL or axolotl")
    _common_refusals(plan, "llamafactory")
    if plan.reference == "precomputed":
        raise Unsupported("llamafactory", "LLaMA-Factory has no precomputed reference log-probs: use --reference "
                                          "adapter (LoRA) or copy (full)")
    if plan.padding_free:
        raise Unsupported("llamafactory", "LLaMA-Factory's DPO has no padding-free batches (--padding-free)")
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        out[k] = v
        if k == "stage":
            out["stage"] = "dpo"
            out["pref_beta"] = float(effective_beta(vars(plan)))
            out["pref_loss"] = "sigmoid"
    out["dataset"] = "dpo_en_demo"  # LLaMA-Factory's demo preference dataset (data/dataset_info.json, ranking)
    return out


def read_llamafactory_rl(data: dict, c: Collect, f: dict[str, Any]) -> None:
    stage = data.get("stage", "sft")
    if stage in ("sft", "pt", None):
        return
    if stage != "dpo":
        c.bad("stage", "only sft and dpo are planned", stage)
        return
    loss = data.get("pref_loss", "sigmoid")
    if loss != "sigmoid":
        c.bad("pref_loss", "only DPO's sigmoid loss is planned", loss)
    f["task"] = DPO
    beta = c.get(data, "pref_beta", "pref_beta", "num", 0.1, record=False)  # LLaMA-Factory's default
    f["beta"] = None if beta is None or float(beta) == TRL_BETA[DPO] else float(beta)
    f["reference"] = "adapter" if f.get("method") != "full" else "copy"
