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
from advisor.core.optimizers import optimizer as optimizer_declaration
from advisor.core.plan import FLASH_ATTENTION, Plan
from advisor.memory.training import CE_CHUNK_TOKENS
from advisor.runtime.tensors import IGNORE_INDEX, TORCH_DTYPES, is_fake, torch_dtype  # noqa: F401 (re-exported)

QUANT_IMPLS = ("auto", "bnb", "standin")
MAX_GRAD_NORM = 1.0       # TrainingArguments.max_grad_norm default (Trainer clips before every step)
TRAINER_DEFAULT_LEARNING_RATE = 5e-5  # TrainingArguments.learning_rate default: what an update inside backward
#                                       steps with (memory and speed do not depend on it)


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
    shard: tuple[int, int] | None = None
    """(rank, sp_degree) of a sequence-parallel step: the batch is that rank's shard of the sequence, and the model is
    given the shard's global positions (Ulysses needs position_ids in every forward: UlyssesSPAttentionHF)."""

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
        pos = packed_position_ids(input_ids, self.plan.doc_len) if self.plan.packing else None
        if pos is None and self.shard is not None:
            pos = shard_position_ids(input_ids, self.shard[0])
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
        elif optimizer_declaration(self.plan.optimizer).fused_backward:
            # Trainer passes the learning rate to accelerate's lomo_backward -> optimizer.fused_backward(loss, lr),
            # which updates each parameter from its gradient hook (accelerate Accelerator.lomo_backward)
            self.optimizer.fused_backward(loss, TRAINER_DEFAULT_LEARNING_RATE)
        else:
            loss.backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        """Clip gradients (Trainer's max_grad_norm), optimizer.step(), zero_grad(set_to_none=True)."""
        import torch

        if self.optimizer is None:
            return
        self._phase("optimizer")
        if self.plan.updates_in_backward:
            # every parameter was updated and its gradient freed inside backward: no clipping over a full
            # gradient, no step (torchtune optimizer_in_bwd; LOMO; transformers' layer-wise GaLore hooks)
            self._phase("zero_grad")
            return
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


def shard_position_ids(input_ids, rank: int):
    """A sequence-parallel rank's positions: its shard of the sequence, from rank x shard length on (what the
    Trainer's UlyssesSPDataLoaderAdapter hands each rank)."""
    import torch

    b, s = input_ids.shape
    return torch.arange(rank * s, (rank + 1) * s, device=input_ids.device).unsqueeze(0).expand(b, s)


def packed_position_ids(input_ids, doc_len: int | None = None):
    """Position ids of packed rows: each document counting from 0, doc_len tokens each and a shorter one where they
    do not fill the row, or two halves when doc_len is not stated (advisor.core.packed_docs.row_documents); what a
    packing collator gives (TRL's padding-free bfd, DataCollatorWithFlattening). No attention_mask, so transformers
    masks attention per document (masking_utils.find_packed_sequence_indices) or flash-attention runs varlen."""
    import torch

    from advisor.core.packed_docs import row_documents

    b, s = input_ids.shape
    row = torch.cat([torch.arange(n, device=input_ids.device) for n in row_documents(s, doc_len)])
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
                         target_device: str | None = None, checkpoint_set: tuple[int, ...] | None = None,
                         on_grad=None, proj_gap: int | None = None, layers: tuple[int, ...] | None = None,
                         apply_peft: bool = True) -> TrainingSetup:
    """The model of ``spec`` with ``plan`` applied, and its optimizer, on ``device``.

    Under an active ``FakeTensorMode`` every tensor is fake (shapes and dtypes only) and
    ``quant_impl="auto"`` picks the stand-ins; on real tensors it picks real bitsandbytes.
    ``num_layers`` builds fewer decoder layers (layer extrapolation). ``target_device`` is the
    device whose behaviour to reproduce (default: ``device``). ``checkpoint_set`` overrides which decoder
    layers are checkpointed (layer extrapolation of partial checkpointing); ``on_grad`` is called with
    each parameter once its gradient is accumulated (the tracker's gradient marks). ``layers`` builds the decoder
    layers of the full model at these indices instead (layers of several kinds: ``select_layers``).
    ``apply_peft=False``: for lora / qlora, the base model as it is before peft wraps it, and no optimizer (a trainer
    given ``lora_config(spec, plan)`` wraps it and builds the optimizer itself, as TRL's trainers do).
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
    model = _build_model(spec, plan, device, num_layers, weights_dir, target, notes, layers)
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
    if plan.tiled_mlp:
        _tile_mlps(model, spec, plan, notes)
    if plan.gradient_checkpointing:
        if plan.checkpoint_layers is None and not plan.activation_offload and checkpoint_set is None:
            # what Trainer does for TrainingArguments(gradient_checkpointing=True) in transformers 5:
            # activation_checkpointing_enable(None) -> use_reentrant=False, enable_input_require_grads()
            model.activation_checkpointing_enable()
        else:
            enable_checkpointing(model, spec, plan, checkpoint_set)
    if plan.activation_offload and not plan.gradient_checkpointing:
        offload_decoder_activations(model)
    if plan.peft and not apply_peft:
        model.train()
        return TrainingSetup(model=model, optimizer=None, plan=plan, spec=spec, device=device, target_device=target,
                             notes=notes)
    if plan.peft:
        model = _apply_lora(model, spec, plan, fake, notes)
    model.train()
    if on_grad is not None:
        # registered before the optimizer's own hooks, so it sees each gradient before an in-backward step frees it
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(on_grad)
    optimizer = build_optimizer(model, plan, target, fake, proj_gap=proj_gap)
    scaler = None
    if plan.precision == "mixed_fp16" and not fake:
        scaler = torch.amp.GradScaler("cuda" if device.startswith("cuda") else "cpu")
    if plan.precision == "mixed_fp16" and fake:
        notes.append("mixed_fp16: GradScaler's in-place unscale is not simulated (no tensor memory)")
    return TrainingSetup(model=model, optimizer=optimizer, plan=plan, spec=spec, device=device,
                         target_device=target, scaler=scaler, notes=notes)


def _tile_mlps(model, spec: ModelSpec, plan: Plan, notes: list[str]) -> None:
    """The tiled MLP: DeepSpeed's TiledMLP on each dense decoder MLP (advisor.runtime.tiled_mlp); a mixture of
    experts or a vision-language model keeps its MLPs whole, as the ledger counts them (advisor.memory.tiled_mlp)."""
    from advisor.memory.tiled_mlp import tiles

    if not tiles(spec, plan):
        notes.append("tiled MLP: not applied (a mixture of experts or a vision-language model keeps its MLPs whole, "
                     "as the ledger counts them)")
        return
    from advisor.runtime.tiled_mlp import apply_tiled_mlp

    notes.append(f"tiled MLP: DeepSpeed TiledMLP on {apply_tiled_mlp(model)} decoder MLP(s)")


def hf_config(spec: ModelSpec, plan: Plan, num_layers: int | None, attn: str, layers: tuple[int, ...] | None = None):
    """The transformers config of ``spec`` for training: ``num_layers`` decoder layers (the first ones), or the
    layers of ``spec`` at the indices ``layers`` in that order (a partial model whose layers are of the kinds
    chosen: advisor.runtime.simulate.extrapolate)."""
    from advisor.core.architecture import hf_config as text_config

    cfg = text_config(build_hf_config(spec.config))
    if layers is not None:
        select_layers(cfg, spec, layers)
    elif num_layers is not None:
        cfg.num_hidden_layers = num_layers
        for key in ("layer_types",):
            if getattr(cfg, key, None):
                setattr(cfg, key, list(getattr(cfg, key))[:num_layers])
    cfg.use_cache = False  # training: no KV cache (forced by checkpointing in transformers, set by SFT recipes)
    cfg._attn_implementation = attn
    if plan.rope_scaling != "none":  # the scaled rope's own init function runs (transformers ROPE_INIT_FUNCTIONS)
        from advisor.core.rope import apply_rope_scaling

        apply_rope_scaling(cfg, spec.max_position_embeddings, plan.rope_scaling)
    return cfg


def select_layers(cfg, spec: ModelSpec, layers: tuple[int, ...]) -> None:
    """Make ``cfg`` build the decoder layers of ``spec`` at ``layers`` (indices of the full model), in that order.

    A layer's kind comes from the config: its ``layer_types`` entry (sliding / full / linear attention), and
    whether its MLP is dense, from ``mlp_only_layers`` (Qwen MoE), ``first_k_dense_replace`` (DeepSeek: dense
    layers first) or ``decoder_sparse_step`` / ``moe_layer_freq``. The chosen layers must be buildable from those
    fields (DeepSeek's dense layers come first), which ``SelectedLayers`` checks on the built model."""
    n = len(layers)
    dense = set(spec.moe.dense_layers) if spec.moe else set()
    cfg.num_hidden_layers = n
    if getattr(cfg, "layer_types", None):
        full = list(cfg.layer_types)
        cfg.layer_types = [full[i] for i in layers]
    if hasattr(cfg, "mlp_only_layers"):
        cfg.mlp_only_layers = [k for k, i in enumerate(layers) if i in dense]
        if hasattr(cfg, "decoder_sparse_step"):
            cfg.decoder_sparse_step = 1
    if hasattr(cfg, "first_k_dense_replace"):
        k = sum(1 for i in layers if i in dense)
        if any(i in dense for i in layers[k:]):
            raise ValueError(f"dense layers must come first in {layers} for {spec.model_type}")
        cfg.first_k_dense_replace = k
        if hasattr(cfg, "moe_layer_freq"):
            cfg.moe_layer_freq = 1


def _attention(spec: ModelSpec, plan: Plan, target: str, notes: list[str]) -> str:
    """The attention the traced (or probed) model runs: the plan's, where the model class accepts it."""
    impl = plan.attn_impl
    if impl in FLASH_ATTENTION:
        import importlib.util

        # FlashAttention-2 is the flash_attn package, FlashAttention-3 its Hopper build's flash_attn_interface
        # (transformers utils/import_utils.is_flash_attn_2_available / is_flash_attn_3_available)
        package = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}[impl]
        if not (target.startswith("cuda") and importlib.util.find_spec(package) is not None):
            notes.append(f"{impl} run as sdpa ({package} absent or not on CUDA): the same saved tensors "
                         "(q, k, v, output, logsumexp)")
            impl = "sdpa"
    if not spec.supports_attention(impl):
        # the class refuses it at load (PreTrainedModel._sdpa_can_dispatch raises ValueError); run what
        # transformers picks when none is asked for (get_correct_attn_implementation: sdpa if supported, else eager)
        d = spec.description
        fallback = d.attn_implementation if d.attn_implementation and spec.supports_attention(
            d.attn_implementation) else "eager"
        notes.append(f"{d.model_class} does not accept attn_implementation={impl!r} (transformers "
                     f"{d.transformers_version}: _supports_sdpa={d.supports_sdpa}, _supports_flash_attn="
                     f"{d.supports_flash_attn}); traced with {fallback}, what transformers picks when none is asked "
                     f"for. A run that asks for {impl} fails when the model loads.")
        impl = fallback
    return impl


def _reference_kernels(spec: ModelSpec, notes: list[str]) -> None:
    """Linear-attention layers (Qwen3-Next's Gated DeltaNet) run flash-linear-attention and causal-conv1d where
    installed, else transformers' PyTorch reference (integrations/hub_kernels.py, which says so once per process
    as a warning; the note says it instead)."""
    import importlib.util
    import logging

    if not any(layer.attention == "linear" for layer in spec.description.layers):
        return
    missing = [name for name, module in (("flash-linear-attention", "fla"), ("causal-conv1d", "causal_conv1d"))
               if importlib.util.find_spec(module) is None]
    if missing:
        logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
        notes.append(f"linear-attention layers ran transformers' PyTorch reference ({', '.join(missing)} not "
                     "installed); the kernels a GPU run uses may save other tensors (not measured), and packed "
                     "sequences need flash-linear-attention")


EXPERTS_IMPLEMENTATION = "grouped_mm"
"""How a mixture of experts runs its experts: transformers 5.24's default (modeling_utils.py:1894) and what CUDA
runs from compute capability 8.0 (integrations/moe.py:343-346); its shapes are tokens x top-k rows whatever the
routing, so a fake-tensor trace equals real execution (reports/moe_findings.md section 4). The ``eager`` loop
cannot run under fake tensors (``nonzero``)."""


def _build_model(spec: ModelSpec, plan: Plan, device: str, num_layers: int | None, weights_dir: str | None,
                 target: str, notes: list[str], layers: tuple[int, ...] | None = None):
    import torch
    from transformers import AutoModelForCausalLM

    attn = _attention(spec, plan, target, notes)
    cfg = hf_config(spec, plan, num_layers, attn, layers)
    _reference_kernels(spec, notes)
    # quantized bases keep their non-quantized parts in the compute dtype (BitsAndBytesConfig + dtype=compute)
    dtype = torch_dtype(plan.compute_dtype if plan.quantized else plan.param_dtype)
    extra = {"experts_implementation": EXPERTS_IMPLEMENTATION} if spec.is_moe else {}
    if weights_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(weights_dir, config=cfg, dtype=dtype, attn_implementation=attn,
                                                     **extra)
        return model.to(device)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn, **extra)
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


def lora_targets(spec: ModelSpec, plan: Plan) -> tuple[list[str], list[str]]:
    """(the LoRA target_modules the run passes to peft, notes) for ``plan`` on ``spec``: advisor.core.adapters,
    the one rule the ledger and the exports follow too."""
    from advisor.core.adapters import lora_targets as resolved

    return resolved(spec, plan)


def lora_config(spec: ModelSpec, plan: Plan, notes: list[str] | None = None):
    """The peft ``LoraConfig`` of ``plan`` on ``spec`` (what a run passes to peft, or to a TRL trainer)."""
    from peft import LoraConfig

    from advisor.core.adapters import expert_problems, target_parameters

    problems = expert_problems(spec, plan)
    if problems:
        raise problems[0]
    targets, more = lora_targets(spec, plan)
    if notes is not None:
        notes += more
    # LoRA on the stacked experts: peft target_parameters, one lora.ParamWrapper per stack (peft/tuners/lora/layer.py)
    parameters = target_parameters(spec) if plan.lora_experts else None
    return LoraConfig(r=plan.lora_r, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout,
                      target_modules=targets or None, target_parameters=parameters, bias="none",
                      task_type="CAUSAL_LM", use_dora=plan.dora)


def _apply_lora(model, spec: ModelSpec, plan: Plan, fake: bool, notes: list[str] | None = None):
    from peft import get_peft_model

    config = lora_config(spec, plan, notes)
    with _module_to_is_noop() if fake else contextlib.nullcontext():
        peft_model = get_peft_model(model, config)
    if fake:
        # .to was skipped: apply peft's autocast_adapter_dtype (fp16/bf16 adapters upcast to fp32) by hand
        import torch

        for name, p in peft_model.named_parameters():
            if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16):
                p.data = p.data.to(torch.float32)
    return peft_model


# --------------------------------------------------------------------------- checkpointing and offload


def enable_checkpointing(model, spec: ModelSpec, plan: Plan, checkpoint_set: tuple[int, ...] | None = None) -> None:
    """Checkpoint some decoder layers, their saved inputs optionally in host memory.

    The real path: ``activation_checkpointing_enable(offload=...)`` as Trainer calls it for
    ``activation_checkpointing_kwargs={"every_n_layers": n, "offload": True}`` (transformers 5
    modeling_utils: ``save_on_cpu(pin_memory=True)`` around ``checkpoint``), then each
    ``GradientCheckpointingLayer``'s flag set to the plan's layers (advisor.plan.checkpointed_layers:
    transformers' own every-n-th choice whenever one gives k layers).
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    from advisor.core.plan import checkpointed_layers

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    chosen = set(checkpoint_set if checkpoint_set is not None else checkpointed_layers(plan, len(layers)))
    model.activation_checkpointing_enable(offload=plan.activation_offload)
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i in chosen


_HOST = [contextlib.nullcontext]
"""Context under which offloaded copies are made: the tracker's ``on_host`` while tracing."""
_SAVED: list = []
"""Called with each tensor an offload hook is handed (autograd saved it): the tracker's saved-tensor mark."""


@contextlib.contextmanager
def host_allocations(context_factory, on_saved=None):
    """Label the copies an activation offload makes as host memory, and what it was handed as saved (for the
    tracker: the offload's own saved-tensor hooks replace the tracker's while they are active)."""
    _HOST.append(context_factory)
    if on_saved is not None:
        _SAVED.append(on_saved)
    try:
        yield
    finally:
        _HOST.pop()
        if on_saved is not None:
            _SAVED.remove(on_saved)


FWD_STASH = 5
"""TRL OffloadActivations max_fwd_stash_size: device tensors kept alive until their copy to the host is done."""


def offload_hooks(min_bytes: int = 1024, skip_parameters: bool = True, stash: int = 0):
    """Saved-tensor hooks that keep activations in (pinned) host memory until backward needs them.

    With the defaults, TRL's / torchtune's ``OffloadActivations`` rule (trl/models/activation_offloading.py:
    tensors of at least ``min_offload_size`` = 1024 bytes not on a parameter's storage); with ``min_bytes=0,
    skip_parameters=False``, ``torch.autograd.graph.save_on_cpu`` (every saved tensor). Pack copies the
    tensor into a host tensor; unpack copies it back to the device, where it lives until backward uses it.
    On the CPU (the simulation, CPU runs) the copy back is a clone standing for the host-to-device copy.
    ``stash``: the last ``stash`` device tensors stay alive until backward begins (TRL's forward stash, whose
    copies run on a side stream and must finish before the memory is reused).
    """
    import collections

    import torch

    pending = collections.deque(maxlen=stash or None) if stash else None

    def pack(t):
        for seen in _SAVED:
            seen(t)
        # TRL skips every tensor on a parameter's storage (``param_storages``): the parameter, or a view of it such as
        # the transposed weight a linear saves
        param = isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)
        if (skip_parameters and param) or t.numel() * t.element_size() < min_bytes:
            return t
        with _HOST[-1]():
            packed = torch.empty(t.size(), dtype=t.dtype, layout=t.layout,
                                 pin_memory=torch.cuda.is_available() and t.device.type == "cuda")
            packed.copy_(t)
        if pending is not None:
            pending.append(t)
        return (t.device, packed)

    def unpack(x):
        if pending:
            pending.clear()  # backward began: every forward copy has finished
        if isinstance(x, torch.Tensor):
            return x
        device, packed = x
        if device.type == "cpu":
            return packed.clone()
        return packed.to(device, non_blocking=packed.is_pinned())

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def offload_decoder_activations(model) -> None:
    """Activation offloading without checkpointing (TRL ``activation_offloading``, torchtune
    ``enable_activation_offloading``: their OffloadActivations hooks, ``offload_hooks`` here): every
    activation the decoder layers save goes to host memory, the last FWD_STASH kept on the device until
    backward begins. The scope is the decoder stack: the output head and the loss keep theirs on the device
    (TRL's no-op manager spares the head; its loss's log-softmax, which TRL would offload too, is counted on
    the device here: the prediction errs high by at most that tensor), and the chunked loss, which calls the
    decoder directly, is covered the same way."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    state: list = []

    def enter(_module, _args):
        ctx = offload_hooks(stash=FWD_STASH)
        ctx.__enter__()
        state.append(ctx)

    def leave(_module, _args, _out):
        state.pop().__exit__(None, None, None)

    decoder.register_forward_pre_hook(enter)
    decoder.register_forward_hook(leave, always_call=True)


# --------------------------------------------------------------------------- optimizer


def build_optimizer(model, plan: Plan, target: str, fake: bool = False, *, proj_gap: int | None = None):
    """The optimizer ``transformers.Trainer`` builds for ``plan.optimizer`` (TrainingArguments.optim).

    Mirrors ``Trainer.create_optimizer``: the class and kwargs from ``get_optimizer_cls_and_kwargs``, the
    weight-decay groups, or the ``params`` / ``model`` that GaLore, APOLLO and LOMO bring themselves.
    ``proj_gap`` overrides GaLore / APOLLO ``update_proj_gap`` (the simulation traces a projection-update step).
    ``plan.optimizer_in_backward`` wraps one optimizer per parameter stepped from its gradient hook.
    """
    import tempfile

    import torch
    from transformers import Trainer, TrainingArguments

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return None
    declared = optimizer_declaration(plan.optimizer)  # its name is TrainingArguments.optim (optimizers.yaml)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, optim=declared.name, report_to=[], use_cpu=True,
                                 **low_rank_args(plan, proj_gap))
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
    # GaLore / APOLLO bring their own groups (projected and not), LOMO the model (Trainer.create_optimizer)
    if "params" in kwargs:
        groups = kwargs.pop("params")
    if "model" in kwargs:
        groups = kwargs.pop("model")
    if "optimizer_dict" in kwargs:
        groups = kwargs.pop("optimizer_dict")
    if cls is torch.optim.AdamW and "fused" not in kwargs and "foreach" not in kwargs:
        # torch's default (foreach=None): foreach on CUDA tensors, the per-tensor loop on the CPU
        # (torch/optim/optimizer.py _default_to_fused_or_foreach); reproduce the target's choice
        kwargs["foreach"] = target.startswith("cuda")
    if isinstance(groups, dict):
        # layer-wise GaLore: one optimizer per parameter, stepped by the hooks transformers registered
        for opt in groups.values():
            _run_eagerly_on_cpu(opt, plan, fake)
    if plan.optimizer_in_backward:
        return optimizer_in_backward(model, cls, kwargs, plan, fake)
    if "bitsandbytes" in getattr(cls, "__module__", ""):
        return _bnb_optimizer(cls, groups, kwargs, model, fake)
    if getattr(cls, "__module__", "").startswith("lomo_optim") and not torch.cuda.is_available():
        from advisor.runtime.simulate.standins import cuda_is_the_cpu

        with cuda_is_the_cpu():  # AdaLomo makes its factored states with .cuda() (lomo_optim/adalomo.py)
            return cls(groups, **kwargs)
    return _run_eagerly_on_cpu(cls(groups, **kwargs), plan, fake)


GALORE_TARGETS = ["self_attn", "mlp"]
"""TrainingArguments.optim_target_modules for GaLore / APOLLO: every decoder-layer linear (substring match,
transformers trainer_utils.check_target_module_exists), as in the transformers GaLore docs' ["attn", "mlp"]."""


def low_rank_args(plan: Plan, proj_gap: int | None = None) -> dict:
    """The TrainingArguments fields GaLore and APOLLO read: target modules and optim_args (rank, gap)."""
    if not optimizer_declaration(plan.optimizer).low_rank:
        return {}
    gap = proj_gap or plan.optim_proj_gap
    return {"optim_target_modules": list(GALORE_TARGETS),
            "optim_args": f"rank={plan.optim_rank},update_proj_gap={gap}"}


class InBackwardOptimizers:
    """torchtune's optimizer-in-backward: one optimizer per parameter, stepped from the parameter's
    post-accumulate-grad hook, which then frees the gradient (torchtune/training/memory.py
    ``register_optim_in_bwd_hooks`` / ``OptimizerInBackwardWrapper``)."""

    def __init__(self, model, make):
        self.optimizers = {}
        for p in model.parameters():
            if p.requires_grad:
                self.optimizers[p] = make([{"params": [p]}])
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p) -> None:
        opt = self.optimizers[p]
        opt.step()
        opt.zero_grad(set_to_none=True)

    @property
    def param_groups(self) -> list:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for opt in self.optimizers.values() for p, s in opt.state.items()}

    def step(self) -> None:  # the work was done in backward
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def optimizer_in_backward(model, cls, kwargs, plan: Plan, fake: bool) -> InBackwardOptimizers:
    if "bitsandbytes" in getattr(cls, "__module__", ""):
        return InBackwardOptimizers(model, lambda groups: _bnb_optimizer(cls, groups, kwargs, model, fake))
    return InBackwardOptimizers(model, lambda groups: _run_eagerly_on_cpu(cls(groups, **kwargs), plan, fake))


def _run_eagerly_on_cpu(opt, plan: Plan, fake: bool):
    """torchao's low-bit AdamW compiles its per-parameter update (``torch.compile(single_param_adam,
    fullgraph=True)``), which cannot run under a dispatch mode or without a GPU compiler; run the same
    function eagerly there (its memory is an upper bound of the compiled kernel's: every fp32 temporary of
    one parameter is materialized). GaLore's 8-bit step calls ``torch.cuda.synchronize``: a no-op without CUDA."""
    import torch

    module = type(opt).__module__
    if module.startswith("torchao.optim") and (fake or not torch.cuda.is_available()):
        from advisor.runtime.simulate.standins import eager_torchao_step

        eager_torchao_step(opt)
    if module == "galore_torch.adamw8bit":
        # a bitsandbytes optimizer: forget the process-wide overrides an earlier model registered (the Trainer
        # registers none for GaLore: "bitsandbytes" is not in its class name)
        import bitsandbytes

        bitsandbytes.optim.GlobalOptimManager.get_instance().initialize()
    if module.startswith("galore_torch") and not torch.cuda.is_available():
        from advisor.runtime.simulate.standins import fake_update_norm, no_cuda_synchronize

        no_cuda_synchronize(opt)
        if fake:
            fake_update_norm()
    return opt


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
