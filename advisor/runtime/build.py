"""Build one training step exactly as a fine-tuning run would: model, plan, optimizer.

``build_training_setup`` is shared by the simulate backend (under ``FakeTensorMode`` on the CPU)
and by the real probes (real tensors, CPU or CUDA), so that what is simulated is what runs:

- the transformers model from its config (no weights unless ``weights_dir``), in the plan's
  dtype, with the plan's attention implementation and ``use_cache=False``;
- 4-bit / 8-bit base layers: real ``bitsandbytes`` ``Linear4bit`` / ``Linear8bitLt`` on real
  tensors, or stand-ins (``advisor.runtime.simulate.standins``) that run the same bitsandbytes autograd
  functions where ``Params4bit`` cannot wrap a fake tensor;
- activation checkpointing enabled the way ``transformers.Trainer`` does
  (``activation_checkpointing_enable``: non-reentrant ``torch.utils.checkpoint``, input grads on);
- peft LoRA or DoRA (``get_peft_model``, ``use_dora``; fp32 adapters by peft's ``autocast_adapter_dtype``);
- the optimizer built by ``Trainer.get_optimizer_cls_and_kwargs`` from the ``TrainingArguments``
  name, with Trainer's weight-decay parameter groups, and the foreach / fused choice the
  *target* device would make (CUDA's defaults when simulating a GPU on the CPU);
- a step as ``Trainer.training_step`` runs it: forward with labels (the model's own causal-LM
  loss; chunked and recomputed when ``plan.loss`` is chunked, fused with the output projection when it
  is fused-linear: liger's kernel on CUDA, its stand-in elsewhere), backward, gradient clipping to 1.0,
  ``optimizer.step()``, ``zero_grad(set_to_none=True)``.

DeepSpeed offload is not built here (the probe wraps the model with DeepSpeed itself).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable

from advisor.core.catalog import ModelSpec, build_hf_config
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan, lora_target_modules
from advisor.runtime.tensors import TORCH_DTYPES, is_fake, torch_dtype  # noqa: F401 (re-exported)

QUANT_IMPLS = ("auto", "bnb", "standin")
MAX_GRAD_NORM = 1.0       # TrainingArguments.max_grad_norm default (Trainer clips before every step)
LEARNING_RATE = 5e-5      # TrainingArguments.learning_rate default
CE_CHUNK_TOKENS = 256     # tokens per chunk of the chunked cross-entropy (advisor.memory.training.CE_CHUNK_TOKENS)
IGNORE_INDEX = -100       # transformers loss_utils ignore_index


@dataclass
class TrainingSetup:
    """A model with the plan applied, its optimizer, and the step that trains it."""

    model: Any
    """The model with the plan applied (peft-wrapped for lora/qlora)."""
    optimizer: Any
    """The optimizer (None when nothing trains)."""
    plan: Plan
    spec: ModelSpec
    device: str = "cpu"
    """Device the tensors live on."""
    target_device: str = "cpu"
    """Device whose behaviour is reproduced (cuda when simulating a GPU step on the CPU)."""
    scaler: Any = None
    """torch.amp.GradScaler for mixed_fp16 on real tensors (Trainer's fp16=True)."""
    notes: list[str] = field(default_factory=list)
    """What differs from the plan as given (e.g. flash_attention_2 replaced by sdpa on the CPU)."""
    phase_hook: Any = None
    """Called with "forward", "backward", "optimizer", "zero_grad" as the step moves on (the tracker's marks)."""

    def _phase(self, name: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name)

    # ------------------------------------------------------------------ the step

    def _autocast(self):
        import torch

        if not self.plan.precision.startswith("mixed"):
            return contextlib.nullcontext()
        dev = "cuda" if self.device.startswith("cuda") else "cpu"
        return torch.autocast(device_type=dev, dtype=torch_dtype(self.plan.activation_dtype))

    def micro_step(self, input_ids, labels):
        """Forward with labels, the model's causal-LM loss, backward; returns the loss (detached)."""
        self._phase("forward")
        pos = packed_position_ids(input_ids) if self.plan.packing else None
        with self._autocast():
            if self.plan.loss == "chunked":
                loss = chunked_causal_lm_loss(self.model, input_ids, labels, position_ids=pos)
            elif self.plan.loss == "fused-linear":
                loss = fused_linear_loss(self.model, input_ids, labels, self.device, self.target_device, pos)
            else:
                # the output (and its logits) is dropped at once, as Trainer.compute_loss returns only the loss
                kwargs = {"position_ids": pos} if pos is not None else {}
                loss = self.model(input_ids=input_ids, labels=labels, **kwargs).loss
        if self.plan.grad_accum > 1:
            loss = loss / self.plan.grad_accum  # Trainer.training_step scales by gradient_accumulation_steps
        self._phase("backward")
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        """Clip gradients (Trainer's max_grad_norm), optimizer.step(), zero_grad(set_to_none=True)."""
        import torch

        if self.optimizer is None:
            return
        self._phase("optimizer")
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        # foreach as the target device would choose it (native tensors on CUDA: the foreach kernels)
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM,
                                       foreach=True if self.target_device.startswith("cuda") else None)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self._phase("zero_grad")
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, batches: Iterable) -> list[float]:
        """``grad_accum`` micro-steps over ``batches`` ((input_ids, labels) pairs), then one optimizer step."""
        losses = []
        for n, (input_ids, labels) in enumerate(batches):
            if n >= self.plan.grad_accum:
                break
            loss = self.micro_step(input_ids, labels)
            losses.append(loss if is_fake(loss) else float(loss))
        self.optimizer_step()
        return losses

    def make_batch(self, seed: int = 0):
        """One (input_ids, labels) micro-batch of random tokens of the plan's shape, on the setup's device."""
        import torch

        shape = (self.plan.micro_batch, self.plan.seq_len)
        if is_fake(next(iter(self.model.parameters()))):
            ids = torch.zeros(shape, dtype=torch.long, device=self.device)
        else:
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, self.spec.vocab_size, shape, generator=g).to(self.device)
        return ids, ids.clone()


# --------------------------------------------------------------------------- loss


def packed_position_ids(input_ids):
    """Position ids of packed rows: two documents per row, each counting from 0 (what a packing collator
    gives: TRL's padding-free bfd, DataCollatorWithFlattening); no attention_mask, so transformers masks
    attention per document (masking_utils.find_packed_sequence_indices). Memory does not depend on where
    the documents meet."""
    import torch

    b, s = input_ids.shape
    half = s // 2
    row = torch.cat([torch.arange(half, device=input_ids.device), torch.arange(s - half, device=input_ids.device)])
    return row.unsqueeze(0).expand(b, s)


def chunked_causal_lm_loss(model, input_ids, labels, chunk_tokens: int = CE_CHUNK_TOKENS, position_ids=None):
    """The causal-LM loss over chunks of the sequence, each chunk's logits recomputed in backward.

    Same value as transformers' ``ForCausalLMLoss`` (labels shifted by one, fp32 logits, mean over
    the tokens that count), but never more than ``chunk_tokens`` tokens of logits alive at once.
    """
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"position_ids": position_ids} if position_ids is not None else {}
    hidden = base.model(input_ids=input_ids, **kwargs).last_hidden_state
    head = base.get_output_embeddings()
    # shift as transformers loss_utils.ForCausalLMLoss does: pad with ignore_index, drop the first label
    shift = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    h = hidden.reshape(-1, hidden.shape[-1])
    y = shift.reshape(-1)
    n_valid = (y != IGNORE_INDEX).sum()

    def chunk_loss(hc, yc):
        return F.cross_entropy(head(hc).float(), yc, ignore_index=IGNORE_INDEX, reduction="sum")

    total = None
    for start in range(0, h.shape[0], chunk_tokens):
        part = checkpoint(chunk_loss, h[start:start + chunk_tokens], y[start:start + chunk_tokens],
                          use_reentrant=False)
        total = part if total is None else total + part
    return total / n_valid


def fused_linear_loss(model, input_ids, labels, device: str, target: str, position_ids=None):
    """Liger's fused linear cross-entropy: the real Triton kernel on a CUDA device with liger_kernel
    installed, else its stand-in (advisor.runtime.simulate.fused_loss, same chunks and saved tensors)."""
    import importlib.util

    from advisor.runtime.simulate.fused_loss import fused_linear_causal_lm_loss

    real = device.startswith("cuda") and importlib.util.find_spec("liger_kernel") is not None
    return fused_linear_causal_lm_loss(model, input_ids, labels, impl="liger" if real else "standin",
                                       position_ids=position_ids)


# --------------------------------------------------------------------------- building


def build_training_setup(spec: ModelSpec, plan: Plan, *, device: str = "cpu", num_layers: int | None = None,
                         quant_impl: str = "auto", weights_dir: str | None = None, seed: int = 0,
                         target_device: str | None = None) -> TrainingSetup:
    """The model of ``spec`` with ``plan`` applied, and its optimizer, on ``device``.

    Under an active ``FakeTensorMode`` every tensor is fake (shapes and dtypes only) and
    ``quant_impl="auto"`` picks the stand-ins; on real tensors it picks real bitsandbytes.
    ``num_layers`` builds fewer decoder layers (layer extrapolation). ``target_device`` is the
    device whose behaviour to reproduce (default: ``device``).
    """
    import torch

    plan.validate()
    if quant_impl not in QUANT_IMPLS:
        raise AdvisorInputError("quant_impl", f"must be one of {', '.join(QUANT_IMPLS)}", quant_impl)
    if num_layers is not None and (not isinstance(num_layers, int) or num_layers < 1):
        raise AdvisorInputError("num_layers", "must be a whole number of at least 1", num_layers)
    target = target_device or device
    notes: list[str] = []
    torch.manual_seed(seed)
    model = _build_model(spec, plan, device, num_layers, weights_dir, target, notes)
    fake = is_fake(next(iter(model.parameters())))
    impl = quant_impl if quant_impl != "auto" else ("standin" if fake else "bnb")
    if fake and impl == "bnb":
        raise AdvisorInputError("quant_impl", "real bitsandbytes cannot quantize fake tensors: use standin or auto",
                                quant_impl)
    if plan.quantized:
        from advisor.runtime.simulate.standins import quantize_model

        quantize_model(model, spec, plan, device=device, impl=impl, target_device=target)
    if plan.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
    if plan.gradient_checkpointing:
        # what Trainer does for TrainingArguments(gradient_checkpointing=True) in transformers 5:
        # activation_checkpointing_enable(None) -> use_reentrant=False, enable_input_require_grads()
        model.activation_checkpointing_enable()
    if plan.peft:
        model = _apply_lora(model, spec, plan, fake)
    model.train()
    optimizer = build_optimizer(model, plan, target, fake)
    scaler = None
    if plan.precision == "mixed_fp16" and not fake:
        scaler = torch.amp.GradScaler("cuda" if device.startswith("cuda") else "cpu")
    if plan.precision == "mixed_fp16" and fake:
        notes.append("mixed_fp16: GradScaler's in-place unscale is not simulated (no tensor memory)")
    return TrainingSetup(model=model, optimizer=optimizer, plan=plan, spec=spec, device=device,
                         target_device=target, scaler=scaler, notes=notes)


def hf_config(spec: ModelSpec, plan: Plan, num_layers: int | None, attn: str):
    cfg = build_hf_config(spec.config)
    if num_layers is not None:
        cfg.num_hidden_layers = num_layers
        for key in ("layer_types",):
            if getattr(cfg, key, None):
                setattr(cfg, key, list(getattr(cfg, key))[:num_layers])
    cfg.use_cache = False  # training: no KV cache (forced by checkpointing in transformers, set by SFT recipes)
    cfg._attn_implementation = attn
    return cfg


def _attention(plan: Plan, target: str, notes: list[str]) -> str:
    if plan.attn_impl != "flash_attention_2":
        return plan.attn_impl
    import importlib.util

    if target.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    notes.append("flash_attention_2 run as sdpa (flash_attn absent or not on CUDA): the same saved tensors "
                 "(q, k, v, output, logsumexp)")
    return "sdpa"


def _build_model(spec: ModelSpec, plan: Plan, device: str, num_layers: int | None, weights_dir: str | None,
                 target: str, notes: list[str]):
    import torch
    from transformers import AutoModelForCausalLM

    attn = _attention(plan, target, notes)
    cfg = hf_config(spec, plan, num_layers, attn)
    # quantized bases keep their non-quantized parts in the compute dtype (BitsAndBytesConfig + dtype=compute)
    dtype = torch_dtype(plan.compute_dtype if plan.quantized else plan.param_dtype)
    if weights_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(weights_dir, config=cfg, dtype=dtype, attn_implementation=attn)
        return model.to(device)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    return model


@contextlib.contextmanager
def _module_to_is_noop():
    """peft moves new adapters with ``Module.to``, which cannot swap fake parameters; skip it while injecting."""
    import torch

    original = torch.nn.Module.to
    torch.nn.Module.to = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.nn.Module.to = original


def _apply_lora(model, spec: ModelSpec, plan: Plan, fake: bool):
    from peft import LoraConfig, get_peft_model

    targets = lora_target_modules(plan, list(spec.linear_shapes()))
    config = LoraConfig(r=plan.lora_r, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout,
                        target_modules=targets, bias="none", task_type="CAUSAL_LM", use_dora=plan.dora)
    with _module_to_is_noop() if fake else contextlib.nullcontext():
        peft_model = get_peft_model(model, config)
    if fake:
        # .to was skipped: apply peft's autocast_adapter_dtype (fp16/bf16 adapters upcast to fp32) by hand
        import torch

        for name, p in peft_model.named_parameters():
            if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16):
                p.data = p.data.to(torch.float32)
    return peft_model


# --------------------------------------------------------------------------- optimizer


def build_optimizer(model, plan: Plan, target: str, fake: bool = False):
    """The optimizer ``transformers.Trainer`` builds for ``plan.optimizer`` (TrainingArguments.optim)."""
    import tempfile

    import torch
    from transformers import Trainer, TrainingArguments

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, optim=plan.optimizer, report_to=[], use_cpu=True)
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs = dict(kwargs)
    # Trainer.create_optimizer: weight decay (0.0 by default) on all but biases and norms, two groups
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if cls is torch.optim.AdamW and "fused" not in kwargs and "foreach" not in kwargs:
        # torch's default (foreach=None): foreach on CUDA tensors, the per-tensor loop on the CPU
        # (torch/optim/optimizer.py _default_to_fused_or_foreach); reproduce the target's choice
        kwargs["foreach"] = target.startswith("cuda")
    if "bitsandbytes" in getattr(cls, "__module__", ""):
        return _bnb_optimizer(cls, groups, kwargs, model, fake)
    return cls(groups, **kwargs)


def _bnb_optimizer(cls, groups, kwargs, model, fake: bool):
    import torch

    from advisor.runtime.simulate.standins import fake_dynamic_map

    with fake_dynamic_map() if fake else contextlib.nullcontext():
        opt = cls(groups, **kwargs)  # builds its 8-bit quantization maps with .tolist()
    if kwargs.get("optim_bits") == 8:
        # Trainer.create_optimizer keeps embeddings in 32-bit optimizer state (GlobalOptimManager override)
        import bitsandbytes

        manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
        # the manager is a process-wide singleton matching parameters by id(): forget earlier models, whose
        # freed parameters' ids may be reused by this one's
        manager.initialize()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    if kwargs.get("is_paged"):
        from advisor.runtime.simulate.standins import unpage_optimizer

        if fake or not torch.cuda.is_available():
            # paged buffers come from cudaMallocManaged; without CUDA keep them as ordinary tensors
            unpage_optimizer(opt)
    return opt
