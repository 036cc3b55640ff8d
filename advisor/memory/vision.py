"""The vision tower and projector of a vision-language model in the training ledger.

The tower runs its own sequence (its patches, ``VisionInput.vision_tokens``: four times the image tokens the
language model sees after a 2x2 merge), before the language model, and its backward comes last. What it holds:

- its weights (the tower and the projector: ``VisionFacts.params``; the ``nn.Linear`` ones quantized with the
  language model's under QLoRA, since bitsandbytes replaces every ``nn.Linear`` but the head:
  transformers/integrations/bitsandbytes.py ``replace_with_bnb_linear``) and, where it trains, its gradients and
  optimizer states;
- its saved activations, where something in it trains or where its input requires grad: a frozen tower under a
  frozen projector records no graph (torch autograd saves tensors only for ops with an input that requires grad)
  unless checkpointing is enabled, which in transformers 5 makes every sub-model's input embeddings require grad
  (``enable_input_require_grads``: the tower's patch embedding too), so its blocks save their norms', attention's
  and activations' inputs, not their frozen linears'. Trained (LoRA or full), each block saves its norms' fp32 inputs,
  the inputs of the linears whose weight or adapter trains (a LoRA'd one with dropout: peft's dropout output and its
  bool mask instead), q/k/v and the output of attention, the MLP's activation inputs (measured per block on the
  CPU with saved-tensor hooks on Qwen2.5-VL-7B's real widths: within 1.5% trained in full or LoRA without dropout,
  +2.3% with dropout once the CPU's dropout mask, held in the compute dtype there, is counted as CUDA's bool); with
  ``--vision-gradient-checkpointing`` each block's input only, one block recomputed at a time;
- its attention workspace: flash-attention runs the images as one varlen batch (``cu_seqlens``) and holds nothing
  beyond its output; sdpa and eager run each image (each window in Qwen2.5-VL's windowed blocks) on its own
  (transformers 5.24 ``Qwen2_5_VLVisionAttention.forward``: ``torch.split`` by ``cu_seqlens``), eager
  materializing heads x L x L scores per chunk in the compute dtype and their fp32 softmax;
- the pixels: ``pixel_values`` in fp32 as the processor makes them (Qwen: C x 2 x 14 x 14 = 1176 values per patch).

The language model's sequence holds the image tokens (``VisionInput.text_tokens``): advisor.memory.training sizes it
at ``--seq-len`` text tokens plus those.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from advisor.core.catalog import ModelSpec
from advisor.core.dtypes import DTYPE_BYTES
from advisor.core.plan import ALL_LINEAR, Plan

QUANT_BYTES_PER_PARAM = {"nf4": 0.5 + 4 / 64, "fp4": 0.5 + 4 / 64, "int8": 1.0}
"""bitsandbytes storage per quantized weight: 4-bit codes plus an fp32 absmax per 64 values (Dettmers et al. 2023
§2: 0.5 + 32/64 bits), int8 codes (the per-row scale is negligible); double quantization ~0.127 bit less."""
DOUBLE_QUANT_SAVING = 0.127 / 8 * 4 / 4  # bytes per param saved by double quantization (QLoRA §3: 0.373 vs 0.5 bit)


@dataclass(frozen=True)
class VisionLedger:
    """The tower's part of one training step, bytes (per micro-batch: ``micro_batch`` samples of the planned
    size)."""

    weights: int
    """Tower and projector weights (quantized linears included)."""
    quant_constants: int
    adapter_weights: int
    """LoRA adapters on the tower (fp32, as peft keeps them)."""
    gradients: int
    optimizer_states: int
    trainable_params: int
    saved_activations: int
    """What the tower's forward keeps for its backward (0 when nothing in it trains)."""
    pixel_values: int
    """The processor's fp32 pixels of the micro-batch."""
    forward_transient: int
    """The largest temporary of one block's forward (its MLP or qkv output, eager scores)."""
    backward_transient: int
    """The largest temporary of one block's backward (0 without a backward through the tower)."""
    attention_workspace: int
    """The attention's own temporary in the largest chunk (flash: 0; eager: the scores and their softmax)."""
    vision_tokens: int
    """The tower's sequence over the micro-batch."""
    image_tokens: int
    """Language-model tokens the micro-batch's images and videos take."""
    lora_modules: tuple[str, ...]
    """The tower's linears that get adapters (a block's), empty without LoRA on the tower."""
    lora_targets_note: str

    @property
    def has_backward(self) -> bool:
        return self.trainable_params > 0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["lora_modules"] = list(self.lora_modules)
        return out


def applies(model: ModelSpec, plan: Plan) -> bool:
    """The model is a vision-language one: its tower and projector are loaded with it (the ConditionalGeneration
    class every stack trains builds them) and held on the GPU, a text-only sample or not; what they save and
    compute comes with images or video (``estimate_vision`` with no sample: weights, and what a trained part keeps)."""
    return model.vision is not None


def tower_lora_modules(model: ModelSpec, plan: Plan) -> tuple[tuple[str, ...], str]:
    """The tower block's linears that get adapters, and what the plan's targets mean there.

    peft matches ``target_modules`` names against every module of the whole model (peft/tuners/tuners_utils.py
    ``check_target_module_exists``: a suffix match), so the language model's names reach the tower wherever it
    uses the same ones (Qwen2.5-VL's tower MLP is gate/up/down_proj, SigLIP's attention q/k/v_proj), and peft's
    ``all-linear`` takes every ``nn.Linear`` but the output head, the tower and projector included
    (``_maybe_include_all_linear_layers``). The plan adapts the tower only with ``--vision-tower lora``; otherwise
    the exported targets exclude it (a regex on the language model: LLaMA-Factory's ``freeze_vision_tower``,
    ms-swift's ``freeze_vit``)."""
    v = model.vision
    names = [m.short for m in v.block_linears]
    if plan.vision_tower != "lora" or not plan.peft:
        reached = set(names) if plan.lora_targets == ALL_LINEAR else set(names) & set(plan.lora_targets or ())
        shared = sorted(reached) if plan.peft else []
        note = ("the tower is frozen: LoRA on the language model only"
                + (f" (peft's {'all-linear' if plan.lora_targets == ALL_LINEAR else 'names'} would also reach the "
                   f"tower's {', '.join(shared)}: the exported targets exclude the tower)" if shared else ""))
        if not plan.peft:
            note = "the tower is frozen" if plan.vision_tower == "frozen" else "the tower trains in full"
        return (), note
    if plan.lora_targets == ALL_LINEAR:
        return tuple(names), "all-linear on the tower: every linear of each block"
    chosen = tuple(n for n in names if n in plan.lora_targets)
    if not chosen:
        return tuple(names), (f"none of {', '.join(plan.lora_targets)} names a tower linear ({', '.join(names)}): "
                              "every linear of each block adapted")
    return chosen, f"{', '.join(chosen)} of each block"


def _mlp_kind(model: ModelSpec) -> str:
    names = {m.short for m in model.vision.block_linears}
    if "gate_proj" in names:
        return "swiglu"
    act = (model.vision.hidden_act or "").lower()
    return "quick_gelu" if "quick" in act else "gelu"


def block_saved_per_token(model: ModelSpec, plan: Plan, trained_linears: set[str], full: bool) -> int:
    """Bytes one trained tower block saves per token of its sequence (see the module docstring)."""
    v = model.vision
    p = DTYPE_BYTES[plan.activation_dtype]
    w, i = v.hidden_size, v.intermediate_size
    rms = "Qwen" in v.tower_class
    norm = (4 * w + 4) if rms else (p * w + 8)  # RMSNorm: the fp32 upcast input and rsqrt; LayerNorm: input, mean, rstd
    total = v.block_norms * (norm + (p * w if full else 0))  # the normalized output where the norm weight trains
    seen_inputs: set[tuple] = set()
    for m in v.block_linears:  # each distinct input once (q/k/v and gate/up share theirs)
        if m.short not in trained_linears:
            continue
        key = (m.in_features, m.name.split(".")[0])
        if full or plan.lora_dropout == 0:  # the weight's (or lora_A's) input is the block's own tensor
            if key not in seen_inputs:
                seen_inputs.add(key)
                total += p * m.in_features
        else:  # peft: lora_A reads dropout(x): its output and its mask (bool on CUDA: native_dropout) per module
            total += p * m.in_features + m.in_features
        if not full:
            total += p * plan.lora_r  # lora_B's input (lora_A's output)
    total += 4 * p * w  # q, k, v and the attention output (sdpa / flash save them for backward)
    # the rotary (Qwen's apply_rotary_pos_emb_vision) multiplies by cos / sin, which need no grad: nothing per block
    kind = _mlp_kind(model)
    total += {"swiglu": 4, "quick_gelu": 3, "gelu": 2}[kind] * p * i
    return total


def _chunks(vis, model: ModelSpec) -> list[int]:
    """The sequences the tower's full-attention blocks attend within: one per image, one per temporal patch of a
    video (Qwen's cu_seqlens repeat each frame pair: ``repeat_interleave(grid_h * grid_w, grid_t)``)."""
    out = []
    for patches, grid in vis.sequences():
        t = grid[0]
        out += [patches // t] * t if t > 1 else [patches]
    return out


def _windows(vis, model: ModelSpec) -> list[int]:
    """The windows the windowed blocks attend within (Qwen2.5-VL: ``window_size`` pixels square, 112 / 14 = 8
    patches a side, 64 patches; the edge windows smaller: ``get_window_index`` pads the grid to whole windows)."""
    v = model.vision
    side = v.window_size // v.patch_size
    out = []
    for _, (t, gh, gw) in vis.sequences():
        for r in range(0, gh, side):
            for c in range(0, gw, side):
                out += [min(side, gh - r) * min(side, gw - c)] * t
    return out


def block_chunks(vis, model: ModelSpec) -> list[list[int]]:
    """Each block's attention chunks (windows for Qwen2.5-VL's windowed blocks, whole images otherwise)."""
    v = model.vision
    full = _chunks(vis, model)
    if v.full_attention_blocks is None or not v.window_size:
        return [full] * v.depth
    windows = _windows(vis, model)
    return [full if i in v.full_attention_blocks else windows for i in range(v.depth)]


def attention_bytes(model: ModelSpec, plan: Plan, chunk: int) -> tuple[int, int]:
    """(workspace, saved) bytes of one chunk's attention in one block: eager's heads x L x L scores (the compute
    dtype) and their fp32 softmax (transformers eager_attention_forward: softmax(dtype=float32).to(dtype)); the
    softmax output is saved for backward. sdpa and flash: no scores."""
    if plan.attn_impl != "eager":
        return 0, 0
    p = DTYPE_BYTES[plan.activation_dtype]
    scores = model.vision.num_heads * chunk * chunk
    return scores * (p + 4 + p), scores * p


def tower_blocks(model: ModelSpec) -> int:
    """The tower's blocks of ``block_linears``: its ``depth``, and Mllama's global encoder after the local one
    (MllamaVisionModel: ``num_hidden_layers`` local and ``num_global_layers`` global MllamaVisionEncoderLayers)."""
    return model.vision.depth + int((model.config.get("vision_config") or {}).get("num_global_layers") or 0)


def estimate_vision(model: ModelSpec, plan: Plan, vis, state_bytes_per_trained_byte: float) -> VisionLedger:
    """The tower's part of the step for ``plan`` over ``vis`` (advisor.core.vision_tokens.VisionInput of one sample;
    None: no image, a trained tower only). ``state_bytes_per_trained_byte``: the optimizer states the plan's
    optimizer keeps per byte of trainable parameter (the language model's ledger's ratio: AdamW keeps two moments
    in the parameter's dtype)."""
    v = model.vision
    b = plan.micro_batch
    pdt = DTYPE_BYTES[plan.param_dtype]
    p = DTYPE_BYTES[plan.activation_dtype]
    blocks = tower_blocks(model)
    linear = blocks * sum(m.in_features * m.out_features for m in v.block_linears) \
        + sum(m.in_features * m.out_features for m in v.projector_linears)
    consts = 0
    if plan.quantized and plan.vision_tower != "full" and not plan.train_projector:
        per = QUANT_BYTES_PER_PARAM[plan.quantization] - (DOUBLE_QUANT_SAVING if plan.double_quant else 0)
        weights = int(linear * 0.5 if plan.four_bit else linear) + (v.params - linear) * pdt
        consts = int(linear * (per - (0.5 if plan.four_bit else 1.0)))
    else:
        weights = v.params * pdt
    full_tower = plan.vision_tower == "full"
    lora_modules, note = tower_lora_modules(model, plan)
    r = plan.lora_r
    adapter_params = blocks * sum(r * (m.in_features + m.out_features) for m in v.block_linears
                                   if m.short in lora_modules) if lora_modules else 0
    tb = pdt  # a trained weight's gradient is in its own dtype
    trainable = (v.tower_params if full_tower else 0) + (v.projector_params if plan.train_projector else 0)
    grads = trainable * tb + adapter_params * 4
    states = int((trainable * tb + adapter_params * 4) * state_bytes_per_trained_byte)
    tokens = (vis.vision_tokens if vis else 0) * b
    tower_trains = full_tower or bool(lora_modules)
    trained_linears = {m.short for m in v.block_linears} if full_tower else set(lora_modules)
    chunks = block_chunks(vis, model) if vis else [[] for _ in range(v.depth)]
    biggest = max((c for block in chunks for c in block), default=0)
    workspace, _ = attention_bytes(model, plan, biggest)
    saved = 0
    # a frozen tower still records its graph when its input embeddings require grad: every checkpointing enable
    # (transformers 5 activation_checkpointing_enable, peft's and TRL's enable_input_require_grads) hooks each
    # sub-model's get_input_embeddings, the tower's patch embedding too; its frozen linears then save nothing
    graph = tower_trains or plan.gradient_checkpointing or plan.vision_gradient_checkpointing
    if graph and tokens:
        per_token = block_saved_per_token(model, plan, trained_linears, full_tower) * tokens
        blocks = [per_token + b * sum(attention_bytes(model, plan, c)[1] for c in block) for block in chunks]
        if plan.vision_gradient_checkpointing:
            saved = v.depth * p * v.hidden_size * tokens + max(blocks)  # block inputs + one block recomputed
        else:
            saved = sum(blocks)
    if plan.train_projector and tokens:  # the projector's inputs: its norm (fp32) and its linears' inputs
        merge = v.spatial_merge_size ** 2
        saved += tokens * (4 * v.hidden_size + 4) + sum(
            p * m.in_features * (tokens // merge if m.in_features != v.hidden_size else tokens)
            for m in v.projector_linears)
    pixels = b * sum(patches * v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * 4
                     for patches, _ in (vis.sequences() if vis else []))
    if vis and v.image_size:  # a fixed-size processor (SigLIP): the whole image's pixels
        pixels = b * len(vis.images) * v.in_channels * v.image_size ** 2 * 4
    width = max(3 * v.hidden_size, 2 * v.intermediate_size)  # qkv output, or the MLP's two intermediate outputs
    fwd_temp = p * tokens * width + workspace * b
    bwd_temp = (2 * p * tokens * width + workspace * b) if (graph or plan.train_projector) and tokens else 0
    return VisionLedger(
        weights=int(weights), quant_constants=int(consts), adapter_weights=int(adapter_params * 4),
        gradients=int(grads), optimizer_states=states, trainable_params=int(trainable + adapter_params),
        saved_activations=int(saved), pixel_values=int(pixels), forward_transient=int(fwd_temp),
        backward_transient=int(bwd_temp), attention_workspace=int(workspace * b), vision_tokens=int(tokens),
        image_tokens=int((vis.text_tokens if vis else 0) * b), lora_modules=lora_modules, lora_targets_note=note)


def add_to_phases(phases: dict, ledger: VisionLedger) -> None:
    """Lay the tower over the step's phases: its forward comes first (the language model holds nothing yet), its
    saved activations and the pixels live until its backward, which comes last (the image features' gradient
    arrives through the language model's input embeddings)."""
    alive = ledger.saved_activations + ledger.pixel_values
    before_tower_backward = [k for k in phases if k != "optimizer"]
    for k in before_tower_backward:
        phases[k]["activations"] = phases[k].get("activations", 0) + alive
    grads_held = phases["loss"].get("gradients", 0)
    phases["vision-forward"] = dict(gradients=grads_held, activations=alive,
                                    transient=ledger.forward_transient)
    if ledger.has_backward:
        all_grads = phases["optimizer"].get("gradients", 0)
        phases["vision-backward"] = dict(gradients=all_grads + ledger.gradients, activations=alive,
                                         transient=ledger.backward_transient)
        phases["optimizer"]["gradients"] = all_grads + ledger.gradients


def vision_summary(extra: dict, model: ModelSpec, plan: Plan) -> dict:
    """The ``vision`` object of an estimate's output: what the sample becomes (per image, the tower's own sequence,
    the language model's) and the tower's part of the ledger, from the report's ``extra["vision"]``."""
    sample = extra.get("sample") or {}
    v = model.vision
    return {
        "image_tokens_per_image": sample.get("image_tokens_per_image", []),
        "image_tokens": sample.get("image_tokens", 0),
        "video_tokens": sample.get("video_tokens", 0),
        "vision_tokens": sample.get("vision_tokens", 0),
        "tokens_in_text_sequence": sample.get("tokens_in_text_sequence", 0),
        "text_tokens": plan.seq_len,
        "language_model_seq_len": extra.get("language_model_seq_len", plan.seq_len),
        "per_micro_batch": {"vision_tokens": extra["vision_tokens"], "image_tokens": extra["image_tokens"]},
        "images": sample.get("images", []),
        "video": sample.get("video"),
        "processor": sample.get("processor", ""),
        "settings": sample.get("settings", {}),
        "tower": {"class": v.tower_class, "blocks": v.depth, "width": v.hidden_size, "params": v.tower_params,
                  "projector_params": v.projector_params, "full_attention_blocks":
                  list(v.full_attention_blocks) if v.full_attention_blocks is not None else "all",
                  "window_pixels": v.window_size},
        "trains": {"tower": plan.vision_tower, "projector": plan.train_projector,
                   "lora": extra["lora_targets_note"], "lora_modules": extra["lora_modules"],
                   "gradient_checkpointing": plan.vision_gradient_checkpointing},
        # a simulated report's (advisor.runtime.simulate.vision.simulated_vision): its traced parts by category
        "ledger": extra["ledger"] if "ledger" in extra else {
            k: extra[k] for k in ("weights", "quant_constants", "adapter_weights", "gradients", "optimizer_states",
                                  "saved_activations", "pixel_values", "forward_transient", "backward_transient",
                                  "attention_workspace")},
        "ledger_source": extra.get("ledger_source", "closed form (advisor/memory/vision.py)"),
        "attention": plan.attn_impl,
    }
