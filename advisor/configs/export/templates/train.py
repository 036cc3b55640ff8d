#!/usr/bin/env python
"""Fine-tune a causal language model with the plan in advisor.yaml (written by vram-advisor).

    python train.py --data my_data.jsonl                  # JSONL with a "text" field, or a .txt file
    python train.py --data my_data.jsonl --max-steps 200 --model-path /models/Qwen2.5-7B-Instruct
    python train.py --config other/advisor.yaml --data corpus.txt

advisor.yaml's sections are handed to the classes that run them, unchanged:
``model`` -> AutoModelForCausalLM.from_pretrained, ``quantization`` -> BitsAndBytesConfig,
``lora`` -> peft.LoraConfig, ``training`` -> TrainingArguments (whose ``deepspeed`` names
deepspeed.json when the plan offloads to the CPU). Texts are tokenized, joined with the EOS token
and cut into blocks of ``advisor.max_seq_length`` tokens, the length the plan was sized for.
A vision-language model (a ``vision`` section) loads with AutoModelForImageTextToText and its processor, and
trains on JSONL samples with their images (vision_setup.py, beside this script, says how).

Without a CUDA GPU the script still runs (slowly, for a smoke test) and says what it changed:
fp32 weights instead of bf16/fp16, no autocast, SDPA instead of flash-attention, no DeepSpeed.
On several GPUs launch it as advisor.yaml's ``advisor.launch`` says (``torchrun --nproc_per_node N``); the
training section names the DeepSpeed config (``deepspeed``) or FSDP (``fsdp``) the plan's sharding needs.

Requires: torch, transformers, peft, PyYAML; bitsandbytes for quantized or 8-bit/paged plans;
deepspeed for offload plans and tiled_mlp (its TiledMLP); liger-kernel (and a CUDA GPU) for the fused-linear loss.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

IGNORE_INDEX = -100


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().with_name("advisor.yaml")),
                   help="advisor.yaml to read (default: the one next to this script)")
    p.add_argument("--data", required=True, help="training texts: .jsonl with a 'text' field per line, or .txt")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--model-path", default=None, help="load the model from here instead of model.name_or_path")
    p.add_argument("--output-dir", default=None, help="where checkpoints go (default: training.output_dir)")
    p.add_argument("--no-save", action="store_true", help="do not save the trained weights at the end")
    return p.parse_args(argv)


def say(msg: str) -> None:
    print(f"[train.py] {msg}", flush=True)


def load_config(path: Path) -> dict:
    import yaml

    cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for key in ("model", "training"):
        if not isinstance(cfg.get(key), dict):
            sys.exit(f"{path}: section '{key}' is missing")
    return cfg


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


class PackedBlocks:
    """Token blocks of exactly seq_len tokens (a torch-style map dataset). With ``positions`` (advisor.packing)
    each block carries position_ids that restart at every document and no attention_mask, so transformers
    masks attention per document (masking_utils.find_packed_sequence_indices) instead of across the block."""

    def __init__(self, blocks, positions=None):
        self.blocks = blocks
        self.positions = positions

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        import torch

        ids = torch.tensor(self.blocks[i], dtype=torch.long)
        if self.positions is not None:
            return {"input_ids": ids, "position_ids": torch.tensor(self.positions[i], dtype=torch.long),
                    "labels": ids.clone()}
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def pack(tokenizer, texts: list[str], seq_len: int, min_blocks: int, per_document: bool = False) -> PackedBlocks:
    ids: list[int] = []
    pos: list[int] = []
    for text in texts:
        doc = tokenizer(text, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            doc = doc + [tokenizer.eos_token_id]
        ids.extend(doc)
        pos.extend(range(len(doc)))
    if not ids:
        sys.exit("the data holds no tokens")
    need = seq_len * min_blocks
    if len(ids) < need:
        say(f"the data has {len(ids)} tokens, fewer than {min_blocks} block(s) of {seq_len}: repeating it")
        ids, pos = ids * (need // len(ids) + 1), pos * (need // len(ids) + 1)
    n = len(ids) // seq_len
    blocks = [ids[i * seq_len:(i + 1) * seq_len] for i in range(n)]
    if not per_document:
        return PackedBlocks(blocks)
    # a document cut by a block boundary restarts its positions at the block's start
    positions = []
    for i in range(n):
        block = pos[i * seq_len:(i + 1) * seq_len]
        first_start = next((k for k, v in enumerate(block) if v == 0), seq_len)
        positions.append(list(range(first_start)) + block[first_start:])
    return PackedBlocks(blocks, positions)


def chunked_causal_lm_loss(model, input_ids, attention_mask, labels, chunk_tokens: int = 1024, position_ids=None):
    """Next-token cross-entropy without holding all logits: the output projection and the loss run
    over chunks of positions, each recomputed in backward (torch.utils.checkpoint), so at most one
    chunk's logits (and their fp32 copy) live at a time. Equal to the model's own mean loss."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone, head = base.get_decoder(), base.get_output_embeddings()
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    h = hidden[:, :-1, :].reshape(-1, hidden.size(-1))
    y = labels[:, 1:].reshape(-1)

    def ce_sum(h_chunk, y_chunk):
        return F.cross_entropy(head(h_chunk).float(), y_chunk, ignore_index=IGNORE_INDEX, reduction="sum")

    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for start in range(0, h.size(0), chunk_tokens):
        total = total + checkpoint(ce_sum, h[start:start + chunk_tokens], y[start:start + chunk_tokens],
                                   use_reentrant=False)
    return total / (y != IGNORE_INDEX).sum().clamp(min=1)


def checkpointed_layers(k, num_layers: int) -> list[int]:
    """The decoder layers to checkpoint when only k of them are (advisor.core.plan.checkpointed_layers):
    every n-th from layer 0 when some n gives k layers (transformers' every_n_layers), else the first layer
    of each of k equal spans."""
    if k is None or k >= num_layers:
        return list(range(num_layers))
    for n in range(1, num_layers + 1):
        if len(range(0, num_layers, n)) == k:
            return list(range(0, num_layers, n))
    return [i for i in range(num_layers) if i == 0 or (i * k) // num_layers != ((i - 1) * k) // num_layers]


def checkpoint_only(model, k):
    """A TrainerCallback that, once Trainer has turned checkpointing on (before the first step), keeps it on
    the plan's k layers only (each GradientCheckpointingLayer has its own flag)."""
    from transformers import TrainerCallback
    from transformers.modeling_layers import GradientCheckpointingLayer

    class CheckpointOnly(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
            chosen = set(checkpointed_layers(k, len(layers)))
            for i, layer in enumerate(layers):
                layer.gradient_checkpointing = i in chosen
            say(f"checkpointing {len(chosen)} of {len(layers)} decoder layers")

    return CheckpointOnly()


def offload_activations(model) -> None:
    """Activation offloading without checkpointing, with TRL's rule (trl/models/activation_offloading.py):
    every tensor the decoder layers save, of 1 KiB or more and not a parameter's storage (a parameter, or a view of
    one such as the transposed weight a linear saves: TRL skips every tensor on a parameter's storage), goes to
    (pinned) host memory in forward and comes back in backward. The output head and the loss keep theirs (as the
    advisor's memory plan counts them)."""
    import torch

    def pack(t):
        param = isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)
        if param or t.numel() * t.element_size() < 1024:
            return t
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=t.is_cuda)
        host.copy_(t, non_blocking=t.is_cuda)
        return (t.device, host)

    def unpack(x):
        if isinstance(x, torch.Tensor):
            return x
        device, host = x
        return host.to(device, non_blocking=host.is_pinned())

    stack = []

    def enter(_module, _args):
        ctx = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        ctx.__enter__()
        stack.append(ctx)

    def leave(_module, _args, _out):
        stack.pop().__exit__(None, None, None)

    decoder = model.get_decoder()
    decoder.register_forward_pre_hook(enter)
    decoder.register_forward_hook(leave, always_call=True)


def optimizer_in_backward(model, targs):
    """torchtune's optimizer_in_bwd with the optimizer TrainingArguments.optim names: one optimizer per
    parameter, stepped from its post-accumulate-grad hook, which then frees the gradient (no gradient buffer).
    Returns the (optimizer, scheduler) pair for Trainer: transformers' LayerWiseDummyOptimizer (the layer-wise
    GaLore wrapper). The learning rate stays at training.learning_rate (no per-parameter schedule)."""
    from transformers import Trainer
    from transformers.trainer_pt_utils import LayerWiseDummyOptimizer

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(targs, model)
    per_param = {}
    for p in model.parameters():
        if p.requires_grad:
            per_param[p] = cls([{"params": [p]}], **kwargs)

            def step(param):
                per_param[param].step()
                per_param[param].zero_grad(set_to_none=True)

            p.register_post_accumulate_grad_hook(step)
    return LayerWiseDummyOptimizer(optimizer_dict=per_param, lr=targs.learning_rate), None


def adapt_to_cpu(model_s: dict, quant: dict | None, training: dict) -> None:
    """No CUDA: keep the plan's structure, change only what a CPU cannot do (and say so)."""
    if model_s.get("torch_dtype") not in (None, "float32", "auto"):
        say(f"no CUDA GPU: loading weights in float32 instead of {model_s['torch_dtype']}")
        model_s["torch_dtype"] = "float32"
    if training.get("bf16") or training.get("fp16"):
        say("no CUDA GPU: bf16/fp16 autocast off (use_cpu=True)")
    training["bf16"] = training["fp16"] = False
    training["use_cpu"] = True
    if training.get("use_liger_kernel"):
        say("no CUDA GPU: Liger's fused linear cross-entropy off (Triton kernels need a GPU); the model's own loss")
        training["use_liger_kernel"] = False
        training.pop("liger_kernel_config", None)
    if model_s.get("attn_implementation") in ("flash_attention_2", "flash_attention_3"):
        say(f"no CUDA GPU: attention sdpa instead of {model_s['attn_implementation']}")
        model_s["attn_implementation"] = "sdpa"
    kwargs = training.get("gradient_checkpointing_kwargs") or {}
    if kwargs.get("offload"):
        # transformers pins the host copies, which needs an accelerator; on the CPU they are host memory already
        say("no CUDA GPU: checkpoint offload off (the activations already live in host memory)")
        training["gradient_checkpointing_kwargs"] = {k: v for k, v in kwargs.items() if k != "offload"}
    if training.get("deepspeed"):
        say("no CUDA GPU: DeepSpeed ZeRO offload skipped (it needs a GPU); training with the plain optimizer")
        training["deepspeed"] = None
    if training.get("fsdp"):
        say("no CUDA GPU: FSDP skipped (it needs a process group of GPUs); one process, the whole model")
        training["fsdp"] = ""
        training.pop("fsdp_config", None)
    if quant and quant.get("bnb_4bit_compute_dtype") not in (None, "float32"):
        say(f"no CUDA GPU: 4-bit compute dtype float32 instead of {quant['bnb_4bit_compute_dtype']}")
        quant["bnb_4bit_compute_dtype"] = "float32"


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg_path = Path(args.config).resolve()
    cfg = load_config(cfg_path)
    here = cfg_path.parent
    for key, value in ((cfg.get("advisor") or {}).get("env") or {}).items():
        # PYTORCH_CUDA_ALLOC_CONF is read when CUDA starts: set before torch does (the shell's value wins)
        if key not in os.environ:
            os.environ[key] = str(value)
            say(f"{key}={value} (advisor.env)")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, default_data_collator

    model_s = dict(cfg["model"])
    quant = dict(cfg["quantization"]) if cfg.get("quantization") else None
    lora = dict(cfg["lora"]) if cfg.get("lora") else None
    training = dict(cfg["training"])
    advisor = cfg.get("advisor") or {}
    vision = cfg.get("vision")  # a vision-language model: its processor, what trains (vision_setup.py)
    seq_len = int(advisor.get("max_seq_length") or 1024)
    loss_kind = advisor.get("loss") or ("chunked" if advisor.get("chunked_ce") else "plain")
    chunked_ce = loss_kind == "chunked"
    packing = bool(advisor.get("packing"))
    checkpoint_layers = advisor.get("checkpoint_layers")

    cuda = torch.cuda.is_available()
    if not cuda:
        adapt_to_cpu(model_s, quant, training)
    if args.max_steps is not None:
        training["max_steps"] = args.max_steps
    if args.output_dir:
        training["output_dir"] = args.output_dir
    for key in ("output_dir", "deepspeed"):  # relative paths are relative to advisor.yaml
        if training.get(key) and not Path(training[key]).is_absolute():
            training[key] = str(here / training[key])
    ds = training.get("deepspeed")
    if ds and not Path(ds).exists() and (here / Path(ds).name).exists():
        training["deepspeed"] = str(here / Path(ds).name)  # the export was moved: the file beside advisor.yaml
    sp = cfg.get("sequence_parallel")
    if sp and cuda:
        import long_context_setup  # beside this script

        training["parallelism_config"] = long_context_setup.parallelism_config(sp, model_s.get("attn_implementation"))
    elif sp:
        say("no CUDA GPU: sequence parallelism off (one process holds the whole sequence)")
    targs = TrainingArguments(**training)

    source = args.model_path or model_s["name_or_path"]
    dtype_key = "dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype"
    load = {
        dtype_key: getattr(torch, model_s.get("torch_dtype") or "float32"),
        "attn_implementation": model_s.get("attn_implementation"),
        "trust_remote_code": bool(model_s.get("trust_remote_code", False)),
    }
    for key in ("rope_parameters", "max_position_embeddings"):  # --rope-scaling: overrides of the model's config
        if model_s.get(key) is not None:
            load[key] = model_s[key]
            say(f"{key}={model_s[key]} (model)")
    if quant:
        from transformers import BitsAndBytesConfig

        load["quantization_config"] = BitsAndBytesConfig(**quant)
    elif model_s.get("dequantize_mxfp4"):
        # gpt-oss's MXFP4 experts cannot be trained: load them dequantized to bf16 (the OpenAI cookbook's recipe)
        from transformers import Mxfp4Config

        load["quantization_config"] = Mxfp4Config(dequantize=True)
    if cuda and not targs.deepspeed and not targs.fsdp:
        # each process streams the weights onto its own GPU, one tensor staged on the host at a time, instead of
        # materializing the whole model in host RAM per process (advisor.memory.host.load_host_bytes)
        load["device_map"] = {"": targs.local_process_index}
    elif quant and targs.fsdp:
        # FSDP shards a 4-bit model unit by unit from the host: quantized there (bitsandbytes' CPU backend), not
        # whole on each GPU, where bitsandbytes would put it without a device_map (advisor.memory.host.fsdp_host_load)
        load["device_map"] = {"": "cpu"}
    say(f"loading {source}")
    if vision is not None:
        import vision_setup
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(source, **load)
        processor = vision_setup.load_processor(source, vision, load["trust_remote_code"])
        tokenizer = processor.tokenizer
    else:
        model = AutoModelForCausalLM.from_pretrained(source, **load)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=load["trust_remote_code"])
    model.config.use_cache = False  # the KV cache is useless in training and clashes with checkpointing
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    if lora:
        from peft import LoraConfig, get_peft_model

        # prepare_model_for_kbit_training is deliberately not called: it casts every norm and the
        # embeddings to fp32, memory the plan did not count. Inputs need grads for checkpointing:
        if targs.gradient_checkpointing or (vision or {}).get("gradient_checkpointing"):
            model.enable_input_require_grads()
        if vision is not None:  # full module paths: short names and all-linear would reach the tower
            lora["target_modules"] = vision_setup.lora_target_paths(model, lora["target_modules"],
                                                                    vision.get("tower") == "lora")
        model = get_peft_model(model, LoraConfig(**lora))
        model.print_trainable_parameters()
    parts = vision_setup.set_trainable(model, vision) if vision is not None else None

    # a vision-language model keeps its MLPs whole (the plan counts them so)
    tiled = 0
    if advisor.get("tiled_mlp") and vision is None:  # a vision-language model: its MLPs whole
        import long_context_setup  # beside this script

        tiled = long_context_setup.tile_mlps(model)
    if advisor.get("activation_offload") and not targs.gradient_checkpointing:
        offload_activations(model)  # with checkpointing, gradient_checkpointing_kwargs.offload does it
    if vision is not None:
        data = vision_setup.load_samples(Path(args.data))
        seq_len = int(vision.get("max_length") or seq_len)  # the text and the planned sample's image tokens
        collate = vision_setup.collator(processor, seq_len)
        say(f"{len(data)} sample(s) of at most {seq_len} tokens; micro batch {targs.per_device_train_batch_size}, "
            f"accumulation {targs.gradient_accumulation_steps}")
    else:
        data = pack(tokenizer, load_texts(Path(args.data)), seq_len,
                    min_blocks=targs.per_device_train_batch_size * targs.gradient_accumulation_steps,
                    per_document=packing)
        collate = default_data_collator
        say(f"{len(data)} block(s) of {seq_len} tokens; micro batch {targs.per_device_train_batch_size}, "
            f"accumulation {targs.gradient_accumulation_steps}")

    class AdvisorTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if not chunked_ce or return_outputs:
                return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                            num_items_in_batch=num_items_in_batch)
            return chunked_causal_lm_loss(model, inputs["input_ids"], inputs.get("attention_mask"), inputs["labels"],
                                          position_ids=inputs.get("position_ids"))

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    extra = {}
    if advisor.get("optimizer_in_backward"):
        extra["optimizers"] = optimizer_in_backward(model, targs)
    if vision is not None:  # each block's own flag: the language model's layers and the tower's apart
        layers = (lambda n: checkpointed_layers(checkpoint_layers, n)) if targs.gradient_checkpointing else None
        callback = vision_setup.checkpointing(model, layers, bool(vision.get("gradient_checkpointing")))
        extra["callbacks"] = [callback] if callback else []
    elif checkpoint_layers is not None and targs.gradient_checkpointing:
        extra["callbacks"] = [checkpoint_only(model, int(checkpoint_layers))]
    trainer = AdvisorTrainer(model=model, args=targs, train_dataset=data, data_collator=collate,
                             processing_class=tokenizer, **extra)
    result = trainer.train()
    kinds = [type(m).__name__ for m in model.modules()]
    summary = {"steps": trainer.state.global_step, "train_loss": result.training_loss,
               "device": "cuda" if cuda else "cpu", "chunked_ce": chunked_ce, "seq_len": seq_len,
               "loss": loss_kind, "packing": packing, "liger": bool(targs.use_liger_kernel), "tiled_mlps": tiled,
               "linear4bit_modules": kinds.count("Linear4bit"), "linear8bit_modules": kinds.count("Linear8bitLt"),
               "lora_modules": sum(k.startswith("Linear") and hasattr(m, "lora_A")
                                   for k, m in zip(kinds, model.modules())),
               "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
               "optimizer": "{0.__module__}.{0.__name__}".format(type(getattr(trainer.optimizer, "optimizer",
                                                                                   trainer.optimizer))),
               "weights_dtype": str(next(p for p in model.parameters() if p.is_floating_point()).dtype)}
    if cuda:
        summary["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        summary["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        predicted = (advisor.get("prediction") or {}).get("peak_bytes")
        if predicted:
            say(f"peak reserved {summary['peak_reserved_bytes'] / 2**30:.2f} GiB, "
                f"advisor predicted {predicted / 2**30:.2f} GiB")
    if parts is not None:
        summary["vision_trainable_params"] = parts
    if not args.no_save:
        trainer.save_model()
        summary["saved_to"] = targs.output_dir
        if lora and vision is not None:
            summary["non_lora_trainables"] = vision_setup.save_non_lora(model, targs.output_dir)
    print("ADVISOR_TRAIN_SUMMARY " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
