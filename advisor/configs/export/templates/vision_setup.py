"""The vision-language side of an exported run (written by vram-advisor beside train.py or train_trl.py).

The memory plan was made for this model with what its ``vision`` settings say, so the run does the same:

- the processor is the checkpoint's own (``AutoProcessor``), its image pixel bounds set as planned
  (``max_pixels`` / ``min_pixels``: Qwen's ``size.longest_edge`` / ``size.shortest_edge``);
- what trains: the vision tower frozen (the default), LoRA on it (``tower: lora``: every linear of its blocks) or
  trained in full (``tower: full``); the projector (Qwen's merger, ``multi_modal_projector``) frozen unless
  ``train_projector``; LoRA otherwise reaches the language model's linears only, named by their full paths, because
  peft matches short names and ``all-linear`` against every module of the model, the tower's included
  (peft/tuners/tuners_utils.py ``check_target_module_exists``);
- checkpointing: the language model's layers as ``gradient_checkpointing`` (and which of them) say, the
  tower's blocks as ``vision.gradient_checkpointing`` says (transformers' ``gradient_checkpointing_enable`` turns
  on every block, the tower's included);
- the data: JSONL, one sample a line, ``{"messages": [...], "images": ["a.png", ...]}`` (roles and contents as the
  chat template takes them; the images go before the first user message's text, as TRL's
  ``prepare_multimodal_messages`` puts them) or ``{"text": "...", "images": [...]}`` with the processor's image
  placeholder in the text. Image paths are relative to the data file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

IGNORE_INDEX = -100


def say(msg: str) -> None:
    print(f"[vision_setup] {msg}", flush=True)


def image_processor_with_bounds(source: str, vision: dict, trust_remote_code: bool = False):
    """The checkpoint's image processor with the planned pixel bounds (``max_pixels`` / ``min_pixels``, which Qwen's
    image processors map to ``size.longest_edge`` / ``size.shortest_edge``); None when the plan sets none. A bound
    the processor does not take stops the run."""
    from transformers import AutoImageProcessor

    bounds = {k: int(vision[k]) for k in ("min_pixels", "max_pixels") if vision.get(k)}
    if not bounds:
        return None
    images = AutoImageProcessor.from_pretrained(source, trust_remote_code=trust_remote_code, **bounds)
    size = dict(getattr(images, "size", None) or {})
    edge = {"min_pixels": "shortest_edge", "max_pixels": "longest_edge"}
    if any(size.get(edge[k]) != v for k, v in bounds.items()):
        sys.exit(f"vision_setup: {type(images).__name__} did not take the pixel bounds {bounds} (its size: {size})")
    say(f"image pixel bounds {bounds}")
    return images


def load_processor(source: str, vision: dict, trust_remote_code: bool = False):
    """The checkpoint's processor (``AutoProcessor``), its image processor at the planned pixel bounds."""
    from transformers import AutoProcessor

    images = image_processor_with_bounds(source, vision, trust_remote_code)
    extra = {"image_processor": images} if images is not None else {}
    return AutoProcessor.from_pretrained(source, trust_remote_code=trust_remote_code, **extra)


def tower_and_projectors(model):
    """(the vision tower, the projector modules) of a ``*ForConditionalGeneration`` model, peft-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    tower = next((getattr(inner, n) for n in ("visual", "vision_tower", "vision_model") if getattr(inner, n, None)
                  is not None), None)
    if tower is None:
        sys.exit(f"vision_setup: no vision tower found in {type(base).__name__}")
    projectors = [m for m in (getattr(inner, "multi_modal_projector", None), getattr(inner, "connector", None),
                              getattr(tower, "merger", None)) if m is not None]
    projectors += list(getattr(tower, "deepstack_merger_list", None) or [])
    return tower, projectors


def language_model(model):
    """The language model of a ``*ForConditionalGeneration`` model: ``model.language_model`` (SmolVLM's
    ``model.text_model``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base.model, "language_model", None) or base.model.text_model


def lora_target_paths(model, targets, tower_lora: bool) -> list[str]:
    """Full module paths for peft's ``target_modules``: the language model's linears named by ``targets`` (a list
    of short names, or ``all-linear``), and with ``tower_lora`` every linear of the tower's blocks (not the
    projector's)."""
    import torch

    language = {id(m) for m in language_model(model).modules()}
    tower, projectors = tower_and_projectors(model)
    in_projector = {id(m) for p in projectors for m in p.modules()}
    in_tower = {id(m) for m in tower.modules()} - in_projector
    names = None if targets == "all-linear" else set(targets)
    out = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if id(module) in language and (names is None or name.split(".")[-1] in names):
            out.append(name)
        elif tower_lora and id(module) in in_tower:
            out.append(name)
    if not out:
        sys.exit(f"vision_setup: lora target_modules {targets} name no linear of the language model")
    return out


def set_trainable(model, vision: dict) -> dict[str, int]:
    """The tower and projector trained or frozen as planned (after peft or the full fine-tune set the rest);
    returns the trainable parameters of each part."""
    tower, projectors = tower_and_projectors(model)
    full_tower = vision.get("tower", "frozen") == "full"
    for name, p in tower.named_parameters():
        if "lora_" not in name:
            p.requires_grad_(full_tower)
    for m in projectors:
        for p in m.parameters():
            p.requires_grad_(bool(vision.get("train_projector")))
    in_tower = {id(p) for p in tower.parameters()} - {id(p) for m in projectors for p in m.parameters()}
    in_projector = {id(p) for m in projectors for p in m.parameters()}
    counts = {"vision_tower": 0, "projector": 0, "language_model": 0}
    for p in model.parameters():
        if p.requires_grad:
            part = "vision_tower" if id(p) in in_tower else "projector" if id(p) in in_projector else "language_model"
            counts[part] += p.numel()
    say("trainable parameters: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    return counts


def checkpointing(model, language, tower: bool):
    """A TrainerCallback that sets each block's own checkpointing flag before the first step: the language
    model's layers ``language(number of decoder layers)`` picks (None: none), the tower's when ``tower``. Trainer
    turns every block on at the start of training when ``gradient_checkpointing`` is set; the callback turns it on
    itself (non-reentrant, as Trainer would) when only the tower is checkpointed. None when nothing is."""
    if not (language or tower):
        return None
    from transformers import TrainerCallback
    from transformers.modeling_layers import GradientCheckpointingLayer

    class VisionCheckpointing(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if not args.gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            vision_tower, _ = tower_and_projectors(model)
            in_tower = {id(m) for m in vision_tower.modules()}
            blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
            decoder = [m for m in blocks if id(m) not in in_tower]
            chosen = set(language(len(decoder))) if language else set()
            for m in blocks:
                m.gradient_checkpointing = tower if id(m) in in_tower else False
            for i, m in enumerate(decoder):
                m.gradient_checkpointing = i in chosen
            say(f"checkpointing {len(chosen)} of {len(decoder)} decoder layers, "
                f"{len(blocks) - len(decoder) if tower else 0} of {len(blocks) - len(decoder)} tower blocks")

    return VisionCheckpointing()


def load_samples(path: Path) -> list[dict]:
    """The JSONL samples, each image opened (RGB) from its path relative to the data file."""
    from PIL import Image

    samples = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "messages" not in row and "text" not in row:
            sys.exit(f"{path}:{n}: a sample needs 'messages' or 'text'")
        if row.get("videos"):
            sys.exit(f"{path}:{n}: videos are not read by this script (images only)")
        images = [Image.open(path.parent / p if not Path(p).is_absolute() else p).convert("RGB")
                  for p in row.get("images") or []]
        samples.append({**row, "images": images})
    if not samples:
        sys.exit(f"{path}: no samples")
    return samples


def with_images(messages: list[dict], count: int) -> list[dict]:
    """Messages with string contents as text parts and ``count`` image parts before the first user message's text
    (TRL's prepare_multimodal_messages)."""
    out, placed = [], False
    for m in messages:
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        if m["role"] == "user" and not placed:
            parts = [{"type": "image"}] * count + parts
            placed = True
        out.append({**m, "content": parts})
    return out


def collator(processor, max_length: int):
    """Batches of the processor's tensors; labels copy input_ids with padding and the image and video placeholder
    tokens masked (as TRL's DataCollatorForVisionLanguageModeling). A sample longer than ``max_length`` (the length
    the memory plan was sized for) stops the run: cutting it would cut image tokens from their pixels."""
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    special = {t for t in (getattr(processor, "image_token_id", None), getattr(processor, "video_token_id", None))
               if t is not None}

    def collate(samples):
        texts = [processor.apply_chat_template(with_images(s["messages"], len(s["images"])), tokenize=False)
                 if "messages" in s else s["text"] for s in samples]
        images = [s["images"] for s in samples]
        batch = processor(text=texts, images=images if any(images) else None, padding=True, return_tensors="pt")
        longest = int(batch["attention_mask"].sum(dim=1).max())
        if longest > max_length:
            sys.exit(f"vision_setup: a sample of {longest} tokens (text and image tokens) is longer than the "
                     f"{max_length} the memory plan was sized for; plan for it (advisor tune --seq-len) or lower "
                     "the pixel budget")
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = IGNORE_INDEX
        for token in special:
            labels[labels == token] = IGNORE_INDEX
        batch["labels"] = labels
        return batch

    return collate


def save_non_lora(model, output_dir: str) -> str | None:
    """With LoRA, weights trained in full (the projector, a fully trained tower) are not in the adapter file:
    saved beside it (non_lora_trainables.safetensors)."""
    from safetensors.torch import save_file

    tensors = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters()
               if p.requires_grad and "lora_" not in n}
    if not tensors:
        return None
    path = Path(output_dir) / "non_lora_trainables.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return str(path)
