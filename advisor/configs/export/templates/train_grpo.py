#!/usr/bin/env python
"""GRPO-train a causal language model with TRL's GRPOTrainer and the plan in trl.yaml (written by vram-advisor).

    python train_grpo.py --data prompts.jsonl --max-prompt-length 256     # JSONL with a "prompt" field per line
    python train_grpo.py --data prompts.jsonl --max-steps 200 --model-path /models/Qwen2.5-7B-Instruct

trl.yaml holds GRPOConfig and ModelConfig fields side by side, as ``TrlParser((GRPOConfig, ModelConfig))`` reads
them; this script splits them by the two classes' fields, builds the quantization and LoRA configs with TRL's own
helpers (get_quantization_config, get_peft_config) and trains on --data with the reward below.

>>> YOU MUST WRITE THE REWARD: ``reward_function`` below is marked FILL IN. Until you do, the script stops, unless
>>> --placeholder-reward (a toy reward for a smoke test: it teaches nothing) is passed.

GRPOConfig has no max_prompt_length (TRL 1.16 does not truncate prompts): the memory plan was sized for prompts of
at most --max-prompt-length tokens, so longer prompts are dropped, and the script says how many.

Without a CUDA GPU the script still runs (slowly, for a smoke test) and says what it changed: fp32 weights instead
of bf16/fp16, no autocast, SDPA instead of flash-attention, no DeepSpeed, transformers generate() instead of vLLM.

Requires: torch, transformers, trl, datasets, peft, PyYAML; bitsandbytes for quantized or 8-bit/paged plans;
vllm for use_vllm plans; deepspeed for offload plans.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


# ============================================================================ FILL IN: your reward
def reward_function(prompts, completions, **kwargs) -> list[float]:
    """FILL IN: one score per completion (higher is better), e.g. 1.0 when the answer checks out, else 0.0.

    ``prompts`` and ``completions`` are lists of strings (or of chat messages for a conversational dataset), one
    per completion; every other column of the dataset arrives in ``kwargs`` as a list (e.g. kwargs["answer"]).
    See TRL's docs, "Using a custom reward function"."""
    raise NotImplementedError("train_grpo.py: write your reward in reward_function (marked FILL IN), "
                              "or pass --placeholder-reward for a smoke test")
# ============================================================================ end of FILL IN


def placeholder_reward(prompts, completions, **kwargs) -> list[float]:
    """A toy reward for a smoke test only (--placeholder-reward): shorter completions score higher."""
    return [-float(len(str(c))) / 100.0 for c in completions]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().with_name("trl.yaml")),
                   help="trl.yaml to read (default: the one next to this script)")
    p.add_argument("--data", required=True, help="prompts: .jsonl with a 'prompt' field per line (other fields go to "
                                                 "the reward as keyword arguments)")
    p.add_argument("--max-prompt-length", type=int, default=None,
                   help="drop prompts longer than this many tokens (the length the plan was sized for)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--model-path", default=None, help="load the model from here instead of model_name_or_path")
    p.add_argument("--output-dir", default=None, help="where checkpoints go (default: output_dir)")
    p.add_argument("--no-save", action="store_true", help="do not save the trained weights at the end")
    p.add_argument("--placeholder-reward", action="store_true",
                   help="smoke test: a toy reward instead of reward_function (teaches nothing)")
    return p.parse_args(argv)


def say(msg: str) -> None:
    print(f"[train_grpo.py] {msg}", flush=True)


def load_rows(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if "prompt" not in row:
                sys.exit(f"{path}:{n}: no 'prompt' field")
            rows.append(row)
    return rows


def split_config(cfg: dict) -> tuple[dict, dict]:
    """trl.yaml's keys → (GRPOConfig kwargs, ModelConfig kwargs); an unknown key stops the script."""
    from trl import GRPOConfig, ModelConfig

    train_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train, model = {}, {}
    for key, value in cfg.items():
        if key in model_fields:
            model[key] = value
        elif key in train_fields:
            train[key] = value
        else:
            sys.exit(f"trl.yaml: {key} is neither a GRPOConfig nor a ModelConfig field")
    return train, model


def adapt_to_cpu(train: dict, model: dict) -> None:
    """No CUDA: keep the plan's structure, change only what a CPU cannot do (and say so)."""
    if model.get("dtype") not in (None, "float32", "auto"):
        say(f"no CUDA GPU: loading weights in float32 instead of {model['dtype']}")
        model["dtype"] = "float32"
    if train.get("bf16") or train.get("fp16"):
        say("no CUDA GPU: bf16/fp16 autocast off (use_cpu=True)")
    train["bf16"] = train["fp16"] = False
    train["use_cpu"] = True
    if model.get("attn_implementation") in ("flash_attention_2", "flash_attention_3"):
        say(f"no CUDA GPU: attention sdpa instead of {model['attn_implementation']}")
        model["attn_implementation"] = "sdpa"
    if train.get("deepspeed"):
        say("no CUDA GPU: DeepSpeed skipped (it needs a GPU)")
        train["deepspeed"] = None
    if train.get("use_vllm"):
        say("no CUDA GPU: completions generated with transformers generate() instead of vLLM")
        train["use_vllm"] = False
        train["vllm_enable_sleep_mode"] = False


def keep_short_prompts(rows: list[dict], tokenizer, limit: int | None) -> list[dict]:
    if limit is None:
        say("no --max-prompt-length: every prompt kept (the plan was sized for a longest prompt; longer ones need "
            "more memory)")
        return rows
    kept = [r for r in rows if len(tokenizer(str(r["prompt"]))["input_ids"]) <= limit]
    if len(kept) < len(rows):
        say(f"dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than {limit} tokens")
    if not kept:
        sys.exit(f"every prompt is longer than --max-prompt-length {limit}")
    return kept


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg_path = Path(args.config).resolve()
    import yaml

    cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    train, model_kw = split_config(cfg)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config, get_quantization_config

    cuda = torch.cuda.is_available()
    if not cuda:
        adapt_to_cpu(train, model_kw)
    if args.max_steps is not None:
        train["max_steps"] = args.max_steps
    if args.output_dir:
        train["output_dir"] = args.output_dir
    for key in ("output_dir", "deepspeed"):  # relative paths are relative to trl.yaml
        if train.get(key) and not Path(train[key]).is_absolute():
            train[key] = str(cfg_path.parent / train[key])
    grpo_args = GRPOConfig(**train)
    model_args = ModelConfig(**model_kw)

    source = args.model_path or model_args.model_name_or_path
    load = {"dtype": getattr(torch, model_args.dtype or "float32"),
            "attn_implementation": model_args.attn_implementation}
    quant = get_quantization_config(model_args)
    if quant is not None:
        load["quantization_config"] = quant
        if cuda and not grpo_args.deepspeed:
            load["device_map"] = {"": grpo_args.local_process_index}
    say(f"loading {source}")
    model = AutoModelForCausalLM.from_pretrained(source, **load)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    rows = keep_short_prompts(load_rows(Path(args.data)), tokenizer, args.max_prompt_length)
    reward = placeholder_reward if args.placeholder_reward else reward_function
    if args.placeholder_reward:
        say("--placeholder-reward: a toy reward (shorter is better); write reward_function for a real run")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=grpo_args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, peft_config=get_peft_config(model_args))
    result = trainer.train()
    trained = trainer.model
    kinds = [type(m).__name__ for m in trained.modules()]
    summary = {"steps": trainer.state.global_step, "train_loss": result.training_loss,
               "device": "cuda" if cuda else "cpu", "num_generations": grpo_args.num_generations,
               "max_completion_length": grpo_args.max_completion_length, "beta": grpo_args.beta,
               "use_vllm": grpo_args.use_vllm, "prompts": len(rows),
               "reference_model": getattr(trainer, "ref_model", None) is not None,
               "lora_modules": sum(1 for m in trained.modules() if hasattr(m, "lora_A")),
               "linear4bit_modules": kinds.count("Linear4bit"),
               "trainable_params": sum(p.numel() for p in trained.parameters() if p.requires_grad)}
    if cuda:
        summary["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        summary["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    if not args.no_save:
        trainer.save_model()
        summary["saved_to"] = grpo_args.output_dir
    print("ADVISOR_TRAIN_SUMMARY " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
