"""trl.yaml + train_grpo.py / train_dpo.py: a GRPO or DPO plan as a TRL ``GRPOTrainer`` / ``DPOTrainer`` run; and such
a trl.yaml read back.

trl.yaml stays flat, as ``TrlParser((GRPOConfig, ModelConfig))`` reads it: the ``ModelConfig`` keys of the SFT export
(advisor.configs._trl) and the trainer's config (TRL 1.16, trl/trainer/grpo_config.py, dpo_config.py):

- GRPOConfig: ``num_generations``, ``max_completion_length``, ``beta``, ``steps_per_generation``, ``use_vllm`` and
  ``vllm_mode`` (from --generation), ``vllm_gpu_memory_utilization``, ``vllm_enable_sleep_mode`` (TRL sleeps vLLM at
  level 2 only: ``vllm_generation.py`` calls ``llm.sleep(level=2)``) and ``vllm_max_model_length``, written as
  prompt + completion: TRL's default, the model's whole context, needs the KV cache of one sequence that long
  (advisor.memory.rl). GRPOConfig has no ``max_length`` and no ``max_prompt_length``: the script drops prompts
  longer than ``--max-prompt-length`` tokens, the length the plan was sized for (TRL 1.16 does not truncate them).
- DPOConfig: ``max_length`` (of each of chosen and rejected), ``beta``, ``precompute_ref_log_probs`` (from
  --reference precomputed), ``padding_free`` (TRL 1.16 warns and pads instead).

What TRL decides itself: GRPO and DPO score through TRL's fused log-prob head (``add_fused_lm_head``), whatever
``--loss`` an SFT plan would take; the reference of a PEFT policy is the base with its adapter disabled (TRL loads
no copy), of a full fine-tune a frozen copy TRL builds: a frozen copy beside a LoRA policy is not a config setting.
"""

from __future__ import annotations

from typing import Any

from advisor.configs._base import Collect, ExportContext, Unsupported, template
from advisor.core.plan import DPO, GRPO, TRL_BETA, effective_beta

FORMAT = "trl"
SCRIPTS = {GRPO: "train_grpo.py", DPO: "train_dpo.py"}
"""The runnable script each task's export writes beside trl.yaml."""
CONFIG_CLASS = {GRPO: "GRPOConfig", DPO: "DPOConfig"}
SFT_ONLY = ("dataset_text_field", "packing", "packing_strategy", "loss_type")
"""SFTConfig keys of the SFT export that neither GRPOConfig nor DPOConfig takes as the plan means them (their
``loss_type`` is the objective: GRPO's dapo, DPO's sigmoid, left at TRL's default)."""
GRPO_MARKERS = ("num_generations", "max_completion_length", "use_vllm", "vllm_mode", "steps_per_generation",
                "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "generation_batch_size")
DPO_MARKERS = ("precompute_ref_log_probs", "rpo_alpha", "ref_model_sync_steps", "f_divergence_type")
"""Keys only a GRPOConfig / DPOConfig has (a DPO file may also be recognised by ``beta``, which SFTConfig lacks)."""



def task_of(data: dict) -> str | None:
    """The task a flat TRL config trains: grpo or dpo by the keys only their configs have; None: SFT."""
    if any(k in data for k in GRPO_MARKERS):
        return GRPO
    if any(k in data for k in DPO_MARKERS) or "beta" in data:
        return DPO
    return None


def max_model_length(plan) -> int:
    """vLLM's max_model_len for the plan: its longest prompt plus its longest completion."""
    return plan.max_prompt_length + plan.max_completion_length


def rl_fields(ctx: ExportContext) -> dict[str, Any]:
    """The GRPOConfig / DPOConfig keys the plan sets beyond the declared ones (``beta``, the generation engine, the
    reference), refused where TRL cannot say them."""
    plan = ctx.plan
    out: dict[str, Any] = {"beta": float(effective_beta(vars(plan)))}
    if plan.peft and plan.reference == "copy" and (plan.task == DPO or out["beta"] > 0):
        raise Unsupported(FORMAT, "TRL scores a LoRA policy's reference with its adapter disabled; a frozen copy "
                                  "beside it (--reference copy) is no GRPOConfig/DPOConfig setting: use --reference "
                                  "adapter")
    if plan.task == DPO:
        out["precompute_ref_log_probs"] = plan.reference == "precomputed"
        return out
    if plan.activation_offload and not plan.gradient_checkpointing:
        raise Unsupported(FORMAT, "GRPOConfig has no activation_offloading (DPOConfig and SFTConfig do)")
    out["use_vllm"] = plan.generation != "transformers"
    if plan.generation == "vllm-colocate":
        if plan.vllm_sleep == 1:
            raise Unsupported(FORMAT, "TRL 1.16 sleeps vLLM at level 2 only (vllm_enable_sleep_mode: "
                                      "llm.sleep(level=2)): use --vllm-sleep 0 or 2")
        out["vllm_mode"] = "colocate"
        out["vllm_enable_sleep_mode"] = plan.vllm_sleep == 2
        out["vllm_max_model_length"] = max_model_length(plan)
    elif plan.generation == "vllm-server":
        out["vllm_mode"] = "server"
    return out


def rl_config(cfg: dict[str, Any], ctx: ExportContext) -> dict[str, Any]:
    """The SFT export's flat config (ModelConfig + TrainingArguments keys, the declared ones filled) as a GRPO /
    DPO config: SFT's data and loss keys out, GRPO's ``max_length`` out (GRPOConfig has none), the task's own in."""
    plan = ctx.plan
    out = {k: v for k, v in cfg.items() if k not in SFT_ONLY and not (plan.task == GRPO and k == "max_length")}
    if out.get("steps_per_generation", 0) is None:
        del out["steps_per_generation"]  # GRPOConfig's None: the gradient accumulation
    if plan.task == GRPO and out.get("activation_offloading"):
        raise Unsupported(FORMAT, "GRPOConfig has no activation_offloading (DPOConfig and SFTConfig do)")
    out.update(rl_fields(ctx))
    return out


def template_text(task: str) -> str:
    return template(SCRIPTS[task])


def header_lines(ctx: ExportContext) -> list[str]:
    """What the header of an RL trl.yaml says: how to run it, and what TRL does that the plan does not set."""
    plan = ctx.plan
    script = SCRIPTS[plan.task]
    if plan.task == GRPO:
        args = f"--data prompts.jsonl --max-prompt-length {plan.max_prompt_length}"
        lines = [f"Run:  {ctx.launch(script, args, accelerate=True)}   (JSONL with a \"prompt\" field;",
                 f"      write your reward in {script}'s reward_function first: it is marked FILL IN)",
                 f"prompts: the plan was sized for prompts of at most {plan.max_prompt_length} tokens; GRPOConfig has "
                 "no max_prompt_length,", "so the script drops longer prompts (--max-prompt-length)."]
        if plan.generation == "vllm-colocate":
            lines.append(f"vLLM: colocated, {plan.vllm_gpu_memory_utilization:g} of the GPU, max_model_len "
                         f"{max_model_length(plan)} (prompt + completion)"
                         + (", asleep (level 2) while training" if plan.vllm_sleep == 2 else ""))
        elif plan.generation == "vllm-server":
            lines += [f"vLLM: a server on {plan.vllm_gpus} other GPU(s); start it first:",
                      f"  trl vllm-serve --model {ctx.model_id} --tensor-parallel-size {plan.vllm_gpus} "
                      f"--max-model-len {max_model_length(plan)}"]
    else:
        lines = [f"Run:  {ctx.launch(script, '--data pairs.jsonl', accelerate=True)}   (JSONL with prompt / chosen / "
                 "rejected fields,", "      or --dataset-name <a hub preference dataset>)"]
    lines.append(f"log-probs: TRL's fused head ({CONFIG_CLASS[plan.task]} has no loss choice the plan sizes); the "
                 "reference: " + _reference_line(plan))
    return lines


def _reference_line(plan) -> str:
    if plan.task == GRPO and effective_beta(vars(plan)) == 0:
        return "none (beta 0: TRL loads no reference model)."
    if plan.reference == "precomputed":
        return "log-probs computed once before training (precompute_ref_log_probs)."
    if plan.peft:
        return "the policy with its adapter disabled (no copy)."
    return "a frozen copy TRL builds from the same model."


# --------------------------------------------------------------------------- reading

def read_rl(data: dict, task: str, c: Collect, f: dict[str, Any]) -> None:
    """The task and its Custom knobs of a GRPO / DPO trl.yaml into ``f`` (before the declared keys are read, so
    that where they apply is known)."""
    f["task"] = task
    beta = c.get(data, "beta", "beta", "num", None, record=False)
    f["beta"] = None if beta is None or float(beta) == TRL_BETA[task] else float(beta)  # None: TRL's default
    if task == DPO:
        pre = c.get(data, "precompute_ref_log_probs", "precompute_ref_log_probs", "bool", False, record=False)
        f["reference"] = "precomputed" if pre else ("adapter" if f.get("method") != "full" else "copy")
        return
    if f.get("method") == "full" and effective_beta(f) > 0:
        f["reference"] = "copy"
    vllm = c.get(data, "use_vllm", "use_vllm", "bool", False, record=False)
    mode = c.choice(data.get("vllm_mode", "colocate"), {"colocate": "colocate", "server": "server"}, "vllm_mode")
    f["generation"] = "transformers" if not vllm else f"vllm-{mode or 'colocate'}"
    if f["generation"] == "vllm-colocate":
        sleep = c.get(data, "vllm_enable_sleep_mode", "vllm_enable_sleep_mode", "bool", False, record=False)
        f["vllm_sleep"] = 2 if sleep else 0
    completion = c.get(data, "max_completion_length", "max_completion_length", "int", 512, record=False)
    longest = c.get(data, "vllm_max_model_length", "vllm_max_model_length", "int", None, record=False)
    if longest is not None and completion is not None and longest > completion:
        f["max_prompt_length"] = longest - completion  # what an export writes: prompt + completion
    else:
        c.defaulted.append("max_prompt_length")  # the prompts are the dataset's: the Plan's default assumed
