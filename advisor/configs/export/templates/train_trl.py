#!/usr/bin/env python
"""Fine-tune a causal language model with TRL's SFTTrainer and the plan in trl.yaml (written by vram-advisor).

    python train_trl.py --data my_data.jsonl                 # JSONL with a "text" field, or a .txt file
    python train_trl.py --data my_data.jsonl --max-steps 200 --model-path /models/Qwen2.5-7B-Instruct

trl.yaml holds SFTConfig and ModelConfig fields side by side, as ``trl sft --config trl.yaml`` reads
them; this script splits them by the two classes' fields, builds the quantization and LoRA/DoRA
configs with TRL's own helpers (get_quantization_config, get_peft_config) and trains on --data.

Without a CUDA GPU the script still runs (slowly, for a smoke test) and says what it changed:
fp32 weights instead of bf16/fp16, no autocast, SDPA instead of flash-attention, no DeepSpeed.

Requires: torch, transformers, trl, datasets, peft, PyYAML; bitsandbytes for quantized or 8-bit/paged
plans; deepspeed for offload plans and tiled_mlp (its TiledMLP).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().with_name("trl.yaml")),
                   help="trl.yaml to read (default: the one next to this script)")
    p.add_argument("--data", required=True, help="training texts: .jsonl with a 'text' field per line, or .txt")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--model-path", default=None, help="load the model from here instead of model_name_or_path")
    p.add_argument("--output-dir", default=None, help="where checkpoints go (default: output_dir)")
    p.add_argument("--no-save", action="store_true", help="do not save the trained weights at the end")
    return p.parse_args(argv)


def say(msg: str) -> None:
    print(f"[train_trl.py] {msg}", flush=True)


def load_texts(path: Path) -> list[str]:
    if path.suffix in (".jsonl", ".json"):
        texts = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if "text" not in row:
                    sys.exit(f"{path}:{n}: no 'text' field")
                texts.append(str(row["text"]))
        return texts
    return [path.read_text(encoding="utf-8")]


def split_config(cfg: dict) -> tuple[dict, dict]:
    """trl.yaml's keys → (SFTConfig kwargs, ModelConfig kwargs); an unknown key stops the script."""
    from trl import ModelConfig, SFTConfig

    sft_fields = {f.name for f in dataclasses.fields(SFTConfig)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    sft, model = {}, {}
    for key, value in cfg.items():
        if key in model_fields:
            model[key] = value
        elif key in sft_fields:
            sft[key] = value
        else:
            sys.exit(f"trl.yaml: {key} is neither an SFTConfig nor a ModelConfig field")
    return sft, model


def adapt_to_cpu(sft: dict, model: dict) -> None:
    """No CUDA: keep the plan's structure, change only what a CPU cannot do (and say so)."""
    if model.get("dtype") not in (None, "float32", "auto"):
        say(f"no CUDA GPU: loading weights in float32 instead of {model['dtype']}")
        model["dtype"] = "float32"  # TRL's 4-bit compute dtype follows it
    if sft.get("bf16") or sft.get("fp16"):
        say("no CUDA GPU: bf16/fp16 autocast off (use_cpu=True)")
    sft["bf16"] = sft["fp16"] = False
    sft["use_cpu"] = True
    if model.get("attn_implementation") in ("flash_attention_2", "flash_attention_3"):
        say(f"no CUDA GPU: attention sdpa instead of {model['attn_implementation']}")
        model["attn_implementation"] = "sdpa"
    if sft.get("deepspeed"):
        say("no CUDA GPU: DeepSpeed ZeRO offload skipped (it needs a GPU); training with the plain optimizer")
        sft["deepspeed"] = None


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg_path = Path(args.config).resolve()
    import yaml

    cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    # no SFTConfig field: applied here (long_context_setup.tile_mlps); `trl sft` ignores it
    tiled_mlp = bool(cfg.pop("tiled_mlp", False))
    vision = cfg.pop("vision", None)  # a vision-language model: its processor, what trains (vision_setup.py)
    sp = cfg.pop("sequence_parallel", None)  # accelerate's ParallelismConfig (parallelism_config below)
    sft, model_kw = split_config(cfg)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config, get_quantization_config

    cuda = torch.cuda.is_available()
    if not cuda:
        adapt_to_cpu(sft, model_kw)
    if args.max_steps is not None:
        sft["max_steps"] = args.max_steps
    if args.output_dir:
        sft["output_dir"] = args.output_dir
    for key in ("output_dir", "deepspeed"):  # relative paths are relative to trl.yaml
        if sft.get(key) and not Path(sft[key]).is_absolute():
            sft[key] = str(cfg_path.parent / sft[key])
    lm_checkpointing = bool(sft.get("gradient_checkpointing"))
    if vision is not None and lm_checkpointing:
        # each block's own flag is set by vision_setup's callback (the tower's apart); SFTTrainer would turn on
        # every block, the tower's included, before it runs
        sft["gradient_checkpointing"] = False
    if sp and cuda:
        import long_context_setup  # beside this script

        sft["parallelism_config"] = long_context_setup.parallelism_config(sp, model_kw.get("attn_implementation"))
    elif sp:
        say("no CUDA GPU: sequence parallelism off (one process holds the whole sequence)")
    sft_args = SFTConfig(**sft)
    model_args = ModelConfig(**model_kw)

    source = args.model_path or model_args.model_name_or_path
    load = {"dtype": getattr(torch, model_args.dtype or "float32"),
            "attn_implementation": model_args.attn_implementation}
    for key in ("rope_parameters", "max_position_embeddings"):  # --rope-scaling: SFTConfig.model_init_kwargs
        if (sft_args.model_init_kwargs or {}).get(key) is not None:
            load[key] = sft_args.model_init_kwargs[key]
            say(f"{key}={load[key]} (model_init_kwargs)")
    quant = get_quantization_config(model_args)
    if quant is not None:
        load["quantization_config"] = quant
        if cuda and not sft_args.deepspeed and not sft_args.fsdp:
            load["device_map"] = {"": sft_args.local_process_index}
        elif sft_args.fsdp:
            # FSDP shards a 4-bit model unit by unit from the host: quantized there (bitsandbytes' CPU backend), not
            # whole on each GPU (advisor.memory.host.fsdp_host_load)
            load["device_map"] = {"": "cpu"}
    say(f"loading {source}")
    peft_config = get_peft_config(model_args)
    callbacks = []
    if vision is not None:
        import vision_setup
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(source, **load)
        processing = vision_setup.load_processor(source, vision)
        if peft_config is not None:  # full module paths: short names and all-linear would reach the tower
            peft_config.target_modules = vision_setup.lora_target_paths(model, peft_config.target_modules,
                                                                        vision.get("tower") == "lora")
        every_n = int((sft.get("gradient_checkpointing_kwargs") or {}).get("every_n_layers") or 1)
        layers = (lambda n: range(0, n, every_n)) if lm_checkpointing else None
        callback = vision_setup.checkpointing(model, layers, bool(vision.get("gradient_checkpointing")))
        callbacks = [callback] if callback else []
        data = Dataset.from_list(vision_setup.load_samples(Path(args.data)))
    else:
        model = AutoModelForCausalLM.from_pretrained(source, **load)
        processing = AutoTokenizer.from_pretrained(source)
        if processing.pad_token is None:
            processing.pad_token = processing.eos_token
        data = Dataset.from_list([{sft_args.dataset_text_field: t} for t in load_texts(Path(args.data))])
    # before SFTTrainer: peft then wraps the linears inside the tiled MLPs
    tiled = 0
    if tiled_mlp and vision is None:  # a vision-language model: its MLPs whole
        import long_context_setup  # beside this script

        tiled = long_context_setup.tile_mlps(model)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = SFTTrainer(model=model, args=sft_args, train_dataset=data, processing_class=processing,
                         peft_config=peft_config, callbacks=callbacks)
    parts = vision_setup.set_trainable(trainer.model, vision) if vision is not None else None
    result = trainer.train()
    trained = trainer.model
    kinds = [type(m).__name__ for m in trained.modules()]
    summary = {"steps": trainer.state.global_step, "train_loss": result.training_loss,
               "device": "cuda" if cuda else "cpu", "max_length": sft_args.max_length, "packing": sft_args.packing,
               "tiled_mlps": tiled,
               "dora_modules": sum(1 for m in trained.modules() if getattr(m, "lora_magnitude_vector", None)),
               "lora_modules": sum(1 for m in trained.modules() if hasattr(m, "lora_A")),
               "linear4bit_modules": kinds.count("Linear4bit"), "linear8bit_modules": kinds.count("Linear8bitLt"),
               "trainable_params": sum(p.numel() for p in trained.parameters() if p.requires_grad),
               "optimizer": "{0.__module__}.{0.__name__}".format(type(getattr(trainer.optimizer, "optimizer",
                                                                                   trainer.optimizer)))}
    if cuda:
        summary["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        summary["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    if parts is not None:
        summary["vision_trainable_params"] = parts
    if not args.no_save:
        trainer.save_model()
        summary["saved_to"] = sft_args.output_dir
        if peft_config is not None and vision is not None:
            summary["non_lora_trainables"] = vision_setup.save_non_lora(trained, sft_args.output_dir)
    print("ADVISOR_TRAIN_SUMMARY " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
