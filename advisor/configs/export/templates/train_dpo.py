#!/usr/bin/env python
"""DPO-train a causal language model with TRL's DPOTrainer and the plan in trl.yaml (written by vram-advisor).

    python train_dpo.py --data pairs.jsonl                  # JSONL with "prompt", "chosen" and "rejected" fields
    python train_dpo.py --dataset-name trl-lib/ultrafeedback_binarized --max-steps 200

>>> NAME YOUR PREFERENCE DATA: --data (a local JSONL of prompt / chosen / rejected) or --dataset-name (a hub
>>> dataset in TRL's preference format). DPOConfig.max_length in trl.yaml is the length of each of chosen and
>>> rejected the memory plan was sized for; longer pairs are truncated by TRL.

trl.yaml holds DPOConfig and ModelConfig fields side by side, as ``TrlParser((DPOConfig, ModelConfig))`` reads them;
this script splits them by the two classes' fields and builds the quantization and LoRA configs with TRL's own
helpers. The reference is TRL's: the policy with its adapter disabled for LoRA/QLoRA, a frozen copy for a full
fine-tune, or log-probs computed once (precompute_ref_log_probs).

Without a CUDA GPU the script still runs (slowly, for a smoke test) and says what it changed.

Requires: torch, transformers, trl, datasets, peft, PyYAML; bitsandbytes for quantized or 8-bit/paged plans;
deepspeed for offload plans.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

FIELDS = ("prompt", "chosen", "rejected")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().with_name("trl.yaml")),
                   help="trl.yaml to read (default: the one next to this script)")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="preference pairs: .jsonl with prompt, chosen and rejected fields per line")
    data.add_argument("--dataset-name", help="a hub preference dataset (its train split)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--model-path", default=None, help="load the model from here instead of model_name_or_path")
    p.add_argument("--output-dir", default=None, help="where checkpoints go (default: output_dir)")
    p.add_argument("--no-save", action="store_true", help="do not save the trained weights at the end")
    return p.parse_args(argv)


def say(msg: str) -> None:
    print(f"[train_dpo.py] {msg}", flush=True)


def load_pairs(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            missing = [k for k in FIELDS if k not in row]
            if missing:
                sys.exit(f"{path}:{n}: no {', '.join(missing)} field")
            rows.append({k: row[k] for k in FIELDS})
    return rows


def split_config(cfg: dict) -> tuple[dict, dict]:
    """trl.yaml's keys → (DPOConfig kwargs, ModelConfig kwargs); an unknown key stops the script."""
    from trl import DPOConfig, ModelConfig

    train_fields = {f.name for f in dataclasses.fields(DPOConfig)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train, model = {}, {}
    for key, value in cfg.items():
        if key in model_fields:
            model[key] = value
        elif key in train_fields:
            train[key] = value
        else:
            sys.exit(f"trl.yaml: {key} is neither a DPOConfig nor a ModelConfig field")
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
        train["padding_free"] = False
    if train.get("deepspeed"):
        say("no CUDA GPU: DeepSpeed skipped (it needs a GPU)")
        train["deepspeed"] = None


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg_path = Path(args.config).resolve()
    import yaml

    cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    train, model_kw = split_config(cfg)

    import torch
    from datasets import Dataset, load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, ModelConfig, get_peft_config, get_quantization_config

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
    dpo_args = DPOConfig(**train)
    model_args = ModelConfig(**model_kw)

    source = args.model_path or model_args.model_name_or_path
    load = {"dtype": getattr(torch, model_args.dtype or "float32"),
            "attn_implementation": model_args.attn_implementation}
    quant = get_quantization_config(model_args)
    if quant is not None:
        load["quantization_config"] = quant
        if cuda and not dpo_args.deepspeed:
            load["device_map"] = {"": dpo_args.local_process_index}
    say(f"loading {source}")
    model = AutoModelForCausalLM.from_pretrained(source, **load)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    data = Dataset.from_list(load_pairs(Path(args.data))) if args.data else load_dataset(args.dataset_name,
                                                                                        split="train")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = DPOTrainer(model=model, args=dpo_args, train_dataset=data, processing_class=tokenizer,
                         peft_config=get_peft_config(model_args))
    result = trainer.train()
    trained = trainer.model
    kinds = [type(m).__name__ for m in trained.modules()]
    summary = {"steps": trainer.state.global_step, "train_loss": result.training_loss,
               "device": "cuda" if cuda else "cpu", "max_length": dpo_args.max_length, "beta": dpo_args.beta,
               "precompute_ref_log_probs": dpo_args.precompute_ref_log_probs,
               "reference_model": getattr(trainer, "ref_model", None) is not None,
               "lora_modules": sum(1 for m in trained.modules() if hasattr(m, "lora_A")),
               "linear4bit_modules": kinds.count("Linear4bit"),
               "trainable_params": sum(p.numel() for p in trained.parameters() if p.requires_grad)}
    if cuda:
        summary["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        summary["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    if not args.no_save:
        trainer.save_model()
        summary["saved_to"] = dpo_args.output_dir
    print("ADVISOR_TRAIN_SUMMARY " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
