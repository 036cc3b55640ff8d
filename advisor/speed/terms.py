"""The terms of the step time. Each is a small function of ``StepInputs`` (model, plan, GPU,
constants) returning seconds, registered with ``@term(name, per=..., kind=...)``:

- ``per="micro_batch"``: seconds of one forward/backward; the step pays it ``grad_accum`` times.
- ``per="step"``: seconds paid once per optimizer step.
- ``kind``: which per-GPU calibration scale applies (``gpu`` kernels, ``cpu`` host overhead,
  ``link`` host-link and interconnect transfers).

The forward part of a decoder layer (``layer_forward_seconds``) is what gradient checkpointing
runs again, so a term that adds per-layer forward work should add it there too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.plan import DTYPE_BYTES, FLASH_ATTENTION, Plan
from advisor.memory.sharding import DEFAULT_SHARDING, SHARDS_PARAMETERS, SHARDS_STATES
from advisor.memory.training import weight_bytes
from advisor.speed.experts import (expert_lora_seconds, expert_loop_exposed_seconds, experts_elementwise_bytes,
                                   experts_gemm_seconds, experts_launches)
from advisor.speed.inputs import StepInputs, lever_row
from advisor.speed.kernels import attention_seconds, gemm_seconds, stream_seconds
from advisor.speed.layers import LayerKind


@dataclass(frozen=True)
class Term:
    name: str
    fn: Callable[[StepInputs], float]
    per: str   # micro_batch | step
    kind: str  # gpu | cpu | link
    label: str


TERMS: list[Term] = []


def term(name: str, per: str = "micro_batch", kind: str = "gpu", label: str = ""):
    """Register a step-time term (see the module docstring)."""
    if per not in ("micro_batch", "step") or kind not in ("gpu", "cpu", "link"):
        raise ValueError(f"term {name}: per must be micro_batch|step and kind gpu|cpu|link")

    def deco(fn: Callable[[StepInputs], float]):
        TERMS[:] = [t for t in TERMS if t.name != name] + [Term(name, fn, per, kind, label or name)]
        return fn
    return deco


def step_terms(model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int = 1, sharding: str = DEFAULT_SHARDING,
               k: dict | None = None, stack: dict | None = None) -> dict[str, tuple[float, str]]:
    """Uncalibrated seconds per optimizer step of every term, with its kind: name -> (seconds, kind)."""
    return evaluate_terms(StepInputs(model, plan, gpu, gpus, sharding, k, stack))


def evaluate_terms(s: StepInputs) -> dict[str, tuple[float, str]]:
    """Seconds per optimizer step of every registered term for these inputs: name -> (seconds, kind)."""
    out = {}
    for t in TERMS:
        sec = float(t.fn(s))
        out[t.name] = (sec * s.plan.grad_accum if t.per == "micro_batch" else sec, t.kind)
    return out


# ============================================================================ shared per-layer parts

def _cached(s: StepInputs, key: str, compute: Callable[[], float]) -> float:
    cache = s.__dict__.setdefault("_parts", {})
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def all_layers(s: StepInputs, per_layer: Callable[[StepInputs, LayerKind], float]) -> float:
    """Sum of a per-layer quantity over every decoder layer: each kind's value times its number of layers."""
    return sum(kind.count * per_layer(s, kind) for kind in s.kinds)


def _kind_key(kind: LayerKind) -> int:
    return id(kind)


def layer_gemm_seconds(s: StepInputs, which: str, kind: LayerKind) -> float:
    """One decoder layer's GEMMs: ``fwd``, ``dx`` (input gradients) or ``dw`` (weight gradients, full fine-tuning
    only for the linears). Forward y = x W^T is M x K x N; backward dX = dY W is M x N x K and dW = dY^T X is
    N x M x K (2 FLOPs per multiply-add each). A layer with routed experts adds its grouped expert matmuls and
    router (advisor/speed/experts.py)."""
    def compute() -> float:
        M = s.tokens
        total = 0.0
        for _, k_in, n_out in kind.linears:
            if which == "fwd":
                total += gemm_seconds(s, M, n_out, k_in)
            elif which == "dx":
                total += gemm_seconds(s, M, k_in, n_out)
            elif s.full:
                total += gemm_seconds(s, n_out, k_in, M)
        return total + experts_gemm_seconds(s, kind, which)
    return _cached(s, f"gemm_{which}_{_kind_key(kind)}", compute)


def kind_lora_modules(s: StepInputs, kind: LayerKind) -> list[str]:
    """The adapted linears present in this kind of layer."""
    names = kind.names()
    return [m for m in s.lora_linears if m in names]


def layer_lora_gemm_seconds(s: StepInputs, which: str, kind: LayerKind) -> float:
    """One layer's LoRA GEMMs (A: K -> r, B: r -> N; Hu et al. 2021 eq. 3): narrow, so bound by
    reading their M x K / M x N operands rather than by the tensor cores; LoRA on the stacked experts folds
    each stack instead (experts.expert_lora_seconds)."""
    def compute() -> float:
        M, r = s.tokens, s.plan.lora_r
        total = 0.0
        for mod in kind_lora_modules(s, kind):
            k_in, n_out = kind.shape(mod)
            if which == "fwd":
                total += gemm_seconds(s, M, r, k_in) + gemm_seconds(s, M, n_out, r)
            else:  # dX and dW of both A and B (all adapters train)
                total += (gemm_seconds(s, M, r, n_out) + gemm_seconds(s, r, n_out, M)
                          + gemm_seconds(s, M, k_in, r) + gemm_seconds(s, k_in, r, M))
        return total + expert_lora_seconds(s, kind, which)
    return _cached(s, f"lora_gemm_{which}_{_kind_key(kind)}", compute)


def attention_elementwise_per_token(s: StepInputs, kind: LayerKind) -> float:
    """Bytes per token the attention's memory-bound ops move in forward, by attention kind.

    Softmax attention (transformers LlamaAttention / rotary): rotary on q and k (q*cos + rotate_half(q)*sin,
    slicing and cat) 8p (d_q + d_kv); the output's transpose-contiguous 2p d_q; q/k norms (4p + 28) each; repeat_kv's
    expanded k and v 4p d_q under GQA outside FlashAttention-2 (which reads the grouped heads directly); a sigmoid
    output gate from a doubled q_proj 5p d_q (Qwen3-Next). Multi-head latent attention (modeling_deepseek_v2.py):
    the latent's RMSNorm, rotary on the rope dims of q and of the one shared k, the keys assembled from k_nope and
    the broadcast k_rot (written, both read) and the queries concatenated, the output transposed. Gated DeltaNet
    (modeling_qwen3_next.py): q, k, v, z rearranged out of in_proj_qkvz, the causal conv1d and its SiLU over
    q, k and v, q and k repeated to the value heads, the gated RMSNorm (norm, SiLU(z), product)."""
    m, p = s.model, s.act_bytes
    d = m.description
    if kind.attention == "mla" and d.mla is not None:
        mla, H = d.mla, m.num_heads
        dqk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        out = (4 * p + 28) * (mla.kv_lora_rank + (mla.q_lora_rank or 0))
        out += 8 * p * (H * mla.qk_rope_head_dim + mla.qk_rope_head_dim)
        return out + 4 * p * H * dqk + 2 * p * H * dqk + 2 * p * H * mla.v_head_dim
    if kind.attention == "linear" and d.linear_attention is not None:
        la = d.linear_attention
        key_dim, value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
        out = 2 * p * (2 * key_dim + 2 * value_dim) + 4 * p * (2 * key_dim + value_dim)
        if la.num_value_heads > la.num_key_heads:
            out += 4 * p * la.num_value_heads * la.key_head_dim
        return out + (4 * p + 28) * value_dim + 5 * p * value_dim + 20 * la.num_value_heads
    qd, kvd = m.q_dim, m.kv_dim
    out = 8 * p * (qd + kvd) + 2 * p * qd
    if kind.qk_norm:
        out += (4 * p + 28) * (qd + kvd)
    if m.num_kv_heads < m.num_heads and s.plan.attn_impl not in FLASH_ATTENTION:
        out += 4 * p * qd
    if kind.attention_gated:
        out += 5 * p * qd
    return out


def layer_elementwise_bytes(s: StepInputs, kind: LayerKind) -> float:
    """Bytes one decoder layer's forward moves in memory-bound ops, per micro-batch.

    Per token, p = activation bytes (transformers LlamaDecoderLayer / LlamaRMSNorm): RMSNorm upcasts to fp32,
    squares, averages, scales, casts back, multiplies the weight: (4p + 28) h each; two residual adds 3p h each;
    SiLU(gate) * up 5p i over a dense MLP's and a shared expert's width (a shared expert's sigmoid gate scales and
    adds its output: 5p h); the attention's by kind (attention_elementwise_per_token). Routed experts add the
    router's and the permutation's traffic (experts.experts_elementwise_bytes)."""
    def compute() -> float:
        p, h = s.act_bytes, s.model.hidden_size
        per_token = kind.norms * (4 * p + 28) * h + 2 * 3 * p * h + 5 * p * kind.mlp_width
        per_token += attention_elementwise_per_token(s, kind)
        if kind.shared_width:
            per_token += 5 * p * kind.shared_width + (5 * p * h if kind.shared_gate else 3 * p * h)
        return per_token * s.tokens + experts_elementwise_bytes(s, kind)
    return _cached(s, f"elementwise_bytes_{_kind_key(kind)}", compute)


def layer_lora_path_bytes(s: StepInputs, kind: LayerKind) -> float:
    """Bytes one layer's LoRA side paths move in forward, per micro-batch (peft lora.Linear.forward):
    the input cast to the fp32 adapter dtype and back for the autocast matmul ((p+4) twice),
    dropout on it (read, write, 1-byte mask) when lora_dropout > 0, then scale and add the
    adapter output into the base output (5p per output feature)."""
    def compute() -> float:
        p, plan = s.act_bytes, s.plan
        x = s.adapter_bytes
        cast = 2 * (p + x) if x != p else 0
        drop = 2 * x + 1 if plan.lora_dropout > 0 else 0
        total = 0.0
        for mod in kind_lora_modules(s, kind):
            k_in, n_out = kind.shape(mod)
            total += k_in * (cast + drop) + n_out * 5 * p
        return total * s.tokens
    return _cached(s, f"lora_path_bytes_{_kind_key(kind)}", compute)


def dequant_4bit_bytes_per_param(s: StepInputs) -> float:
    """Bytes one 4-bit weight moves each time bitsandbytes dequantizes it (functional.dequantize_4bit
    and the cdequantize_blockwise_*_nf4/fp4 kernel it calls; gemm_4bit's dequant + F.linear path for
    M > 1536 rows): the packed weight read (0.5 B) and its fp32 absmax per 64 (QLoRA §3), written
    back in the compute dtype. With double quantization the absmax is first rebuilt: 8-bit codes
    read, fp32 written by dequantize_blockwise, the offset added in place (``absmax += offset``), then
    read by the 4-bit kernel (QLoRA §3 "Double Quantization")."""
    k, out = s.k, DTYPE_BYTES[s.plan.compute_dtype]
    extra = k["dequant_double_quant_extra_bytes_per_param"] if s.plan.double_quant else 0.0
    return k["dequant_nf4_bytes_per_param"] + extra + out


def _quantized_shapes(kind: LayerKind) -> list[tuple[int, int]]:
    """(in, out) of the layer's linears bitsandbytes quantizes (stacked experts and routers stay 16-bit)."""
    q = set(kind.quantized)
    return [(i, o) for n, i, o in kind.linears if n in q]


def layer_dequant_bytes(s: StepInputs, kind: LayerKind) -> float:
    """Bytes to dequantize one layer's frozen quantized weights for one pass (forward, or backward's dX).

    4-bit: every pass dequantizes each whole weight once, whatever the micro-batch's size
    (bitsandbytes autograd MatMul4Bit: forward through gemm_4bit, backward
    ``F.dequantize_4bit(B, ctx.state)`` before its matmul), so the cost is per micro-batch and is
    amortized over its tokens (dequant_4bit_bytes_per_param).
    8-bit (LLM.int8): forward quantizes the input row-wise and dequantizes the int32 output
    (Dettmers et al. 2022 §3); the backward's dX dequantizes the weight (CB * SCB / 127)."""
    def compute() -> float:
        plan, p = s.plan, s.act_bytes
        shapes = _quantized_shapes(kind)
        if plan.four_bit:
            return sum(i * o for i, o in shapes) * dequant_4bit_bytes_per_param(s)
        if plan.quantization == "int8":
            M = s.tokens
            return sum(M * k_in * (2 * p + 1) + M * n_out * (4 + p) for k_in, n_out in shapes)
        return 0.0
    return _cached(s, f"dequant_bytes_{_kind_key(kind)}", compute)


def layer_dequant_seconds(s: StepInputs, kind: LayerKind) -> float:
    """One layer's dequantization for one pass. 4-bit runs at the rate bitsandbytes' dequantization
    reaches inside a training step (dequant_4bit_bandwidth_efficiency of the datasheet bandwidth,
    fitted on ms-swift's LoRA vs QLoRA ablations); int8's traffic streams like any elementwise op."""
    if s.plan.four_bit:
        return layer_dequant_bytes(s, kind) / s.dequant_4bit_bw
    return stream_seconds(s, layer_dequant_bytes(s, kind))


def int8_backward_bytes(s: StepInputs, kind: LayerKind) -> float:
    """LLM.int8 backward: the weight dequantized to the compute dtype and scaled (read 1 B, write
    and rescale p) before the dX matmul (bitsandbytes MatMul8bitLt.backward)."""
    if s.plan.quantization != "int8":
        return 0.0
    return sum(k_in * n_out * (1 + 3 * s.act_bytes) for k_in, n_out in _quantized_shapes(kind))


def autocasts_weights(s: StepInputs) -> bool:
    """Mixed precision runs the forward under torch autocast with fp32 weights: on one GPU and under DDP. DeepSpeed
    (ZeRO, CPU offload) converts the module to the 16-bit dtype and keeps the fp32 masters in its optimizer
    (DeepSpeed bf16 / fp16 config), and FSDP's mixed-precision policy gathers the weights in it (torch FSDP
    MixedPrecision param_dtype; the 1/N shard's cast before the gather is not counted): no weight to cast."""
    return (s.plan.precision.startswith("mixed") and s.plan.offload == "none"
            and (s.gpus == 1 or s.sharding == "ddp"))


def layer_autocast_cast_bytes(s: StepInputs, kind: LayerKind) -> float:
    """Bytes one layer's forward moves casting its fp32 linear weights for mixed precision, per micro-batch: autocast
    casts each weight to the compute dtype when its matmul runs (read 4 B, write p per weight), a frozen weight at
    every call and a trainable leaf's once per forward (torch autocast_mode.cpp ``cached_cast`` caches only leaves
    that require grad); backward's matmul uses the cast copy it saved. Quantized linears are dequantized instead
    (dequant); routed experts' stacks are not autocast (experts: their input is cast to fp32)."""
    if not autocasts_weights(s):
        return 0.0
    quantized = set(kind.quantized) if s.plan.quantized else set()
    return sum(i * o for n, i, o in kind.linears if n not in quantized) * (4 + s.act_bytes)


def layer_forward_seconds(s: StepInputs, kind: LayerKind) -> float:
    """One decoder layer's forward, all of it: what checkpointing recomputes (Chen et al. 2016)."""
    return (layer_gemm_seconds(s, "fwd", kind) + attention_seconds(s, kind)[0]
            + stream_seconds(s, layer_elementwise_bytes(s, kind) + layer_lora_path_bytes(s, kind)
                             + layer_autocast_cast_bytes(s, kind))
            + layer_dequant_seconds(s, kind) + layer_lora_gemm_seconds(s, "fwd", kind) + dora_layer_seconds(s, kind))


def dora_layer_seconds(s: StepInputs, kind: LayerKind) -> float:
    """DoRA (peft use_dora) recomputes each adapted weight's column norm every forward:
    W + scale B A materialized (a K x r x N GEMM) and read again for the norm (Liu et al. 2024 §4;
    peft DoraLinearLayer.get_weight_norm), plus rescaling the base output."""
    if not s.plan.dora:
        return 0.0
    p, total = s.act_bytes, 0.0
    for mod in kind_lora_modules(s, kind):
        k_in, n_out = kind.shape(mod)
        total += gemm_seconds(s, n_out, k_in, s.plan.lora_r) + stream_seconds(
            s, 3 * p * k_in * n_out + 6 * p * s.tokens * n_out)
        if s.plan.lora_dropout > 0:
            # with dropout peft runs the base matmul again on the dropped-out input (DoraLinearLayer.forward)
            total += gemm_seconds(s, s.tokens, n_out, k_in)
    return total


# ============================================================================ the terms

@term("matmul", label="matmuls")
def matmul(s: StepInputs) -> float:
    """Forward, input-gradient and (full fine-tuning) weight-gradient GEMMs of every decoder layer,
    plus the lm_head: 2 FLOPs per weight per token each (Kaplan et al. 2020 §2.1); routed experts at their
    per-expert row count (experts.grouped_gemm_seconds)."""
    m, M = s.model, s.tokens
    layers = all_layers(s, lambda s, kind: layer_gemm_seconds(s, "fwd", kind) + layer_gemm_seconds(s, "dx", kind)
                        + layer_gemm_seconds(s, "dw", kind))
    h, V = m.hidden_size, m.vocab_size
    head = gemm_seconds(s, M, V, h) + gemm_seconds(s, M, h, V)
    if s.full:
        head += gemm_seconds(s, V, h, M)
    return layers + head  # a fused linear + cross-entropy runs the same GEMMs chunk by chunk


@term("attention", label="attention")
def attention(s: StepInputs) -> float:
    """Attention core by implementation, sequence length and layer kind (kernels.attention_seconds: a sliding
    window, latent attention's widths, Gated DeltaNet's chunked scan)."""
    return all_layers(s, lambda s, kind: sum(attention_seconds(s, kind)))


BACKWARD_TRAFFIC = 1.5  # an elementwise op's backward reads its saved input and the incoming gradient and
#                        writes one gradient: 3 tensors against the forward's 2 (aten derivatives.yaml)


@term("elementwise", label="norms/activations/rotary")
def elementwise(s: StepInputs) -> float:
    """Memory-bound ops of every layer: forward traffic, and 1.5x it in backward."""
    extra = 0.0
    if s.full:
        # the embedding's dense gradient is written every micro-batch (embedding_dense_backward)
        extra = s.model.vocab_size * s.model.hidden_size * s.trainable_bytes
    return stream_seconds(s, (1 + BACKWARD_TRAFFIC) * all_layers(s, layer_elementwise_bytes) + extra)


@term("lora", label="LoRA adapters")
def lora(s: StepInputs) -> float:
    """LoRA GEMMs (forward, dX, dW of A and B) and the side-path traffic, forward + 1.5x backward; LoRA on the
    stacked experts folds and differentiates each stack (experts.expert_lora_seconds)."""
    if not s.lora_linears and not s.expert_lora:
        return 0.0
    return all_layers(s, lambda s, kind: layer_lora_gemm_seconds(s, "fwd", kind)
                      + layer_lora_gemm_seconds(s, "bwd", kind)
                      + stream_seconds(s, (1 + BACKWARD_TRAFFIC) * layer_lora_path_bytes(s, kind))
                      + (1 + BACKWARD_TRAFFIC) * dora_layer_seconds(s, kind))


def _fused_loss(s: StepInputs) -> bool:
    return s.plan.loss == "fused-linear"


@term("loss", label="loss over the vocabulary")
def loss(s: StepInputs) -> float:
    """Cross-entropy over the vocabulary, per token and vocabulary entry (transformers
    ForCausalLMLoss: logits.float(), F.cross_entropy): upcast (p+4), log_softmax (read twice,
    write: 12), nll backward's dense gradient (4), log_softmax backward (12), cast back (4+p).
    Chunked CE moves the same bytes in pieces; a fused linear + cross-entropy kernel never
    materializes the fp32 logits: one write and one in-place read-write of each chunk (Liger §3.3)."""
    p = s.act_bytes
    per = (2 * p + 8) if _fused_loss(s) else s.stack.get("loss_bytes_per_vocab", (4 + p) + 12 + 4 + 12 + (4 + p))
    return stream_seconds(s, per * s.tokens * s.model.vocab_size)


@term("autocast_cast", label="mixed-precision weight casts")
def autocast_cast(s: StepInputs) -> float:
    """Mixed precision: every fp32 linear weight of the decoder layers and the lm_head cast to the compute dtype in
    each forward (layer_autocast_cast_bytes; the recomputation of checkpointed layers casts again, in the
    recompute term). Pure precisions hold their weights in the compute dtype already: nothing to cast."""
    if not autocasts_weights(s):
        return 0.0
    head = s.model.vocab_size * s.model.hidden_size * (4 + s.act_bytes)
    return stream_seconds(s, all_layers(s, layer_autocast_cast_bytes) + head)


@term("recompute", label="recomputation")
def recompute(s: StepInputs) -> float:
    """Checkpointed layers run their forward again in backward (Chen et al. 2016, §3)."""
    return s.checkpointed_fraction * all_layers(s, layer_forward_seconds)


@term("dequant", label="dequantization")
def dequant(s: StepInputs) -> float:
    """Dequantizing the frozen quantized weights of a micro-batch: 4-bit weights once in forward and
    once in backward (layer_dequant_bytes; the recomputation of checkpointed layers dequantizes again,
    in the recompute term), whatever the micro-batch's tokens; int8 per token in forward plus the
    weight in backward."""
    if s.plan.four_bit:
        return 2 * all_layers(s, layer_dequant_seconds)
    if s.plan.quantization == "int8":
        return stream_seconds(s, all_layers(s, lambda s, kind: layer_dequant_bytes(s, kind)
                                            + int8_backward_bytes(s, kind)))
    return 0.0


@term("launch_overhead", kind="cpu", label="launch overhead")
def launch_overhead(s: StepInputs) -> float:
    """Host time of the eager ops of one micro-batch (cpu_seconds_per_op each), paid where kernels
    are too short to hide it: forward, backward (~1.5 launches per forward op), recomputation. Routed experts add
    the routing's ops and, on a card without the grouped GEMM, one matmul per expert (experts.experts_launches);
    latent and linear attention their extra ops."""
    ops = s.k["ops_per_layer"]

    def per_layer(s: StepInputs, kind: LayerKind) -> float:
        n = ops["base"] + ops["lora_module"] * len(kind_lora_modules(s, kind))
        if s.plan.quantized:
            n += ops["quantized_linear"] * len(kind.quantized)
        if kind.attention in ("mla", "linear"):
            n += ops[kind.attention]
        return n + experts_launches(s, kind)

    passes = 1 + ops["backward_ratio"] + s.checkpointed_fraction
    n = all_layers(s, per_layer) * passes + ops["loss"] * (1 + ops["backward_ratio"])
    loop = 0.0
    if s.model.is_moe:  # the per-expert loop of cards without the grouped GEMM, where its launches show
        loop = all_layers(s, lambda s, kind: (1 + s.checkpointed_fraction) * expert_loop_exposed_seconds(s, kind, "fwd")
                          + expert_loop_exposed_seconds(s, kind, "dx") + expert_loop_exposed_seconds(s, kind, "dw"))
    return n * s.k["cpu_seconds_per_op"] + loop


def _optimizer_spec(s: StepInputs) -> dict:
    return lever_row(s, "optimizer_bytes_per_param")


def trainable_tensors(s: StepInputs) -> int:
    """Number of trainable tensors (what per-tensor and foreach launches scale with)."""
    m = s.model
    if s.plan.method != "full":
        def stacks(kind):
            return 2 * len(kind.experts.gemms) if s.expert_lora and kind.experts else 0

        return int(all_layers(s, lambda s, kind: 2 * len(kind_lora_modules(s, kind)) + stacks(kind)))

    def per_layer(s: StepInputs, kind: LayerKind) -> int:
        n = len(kind.linears) + kind.norms + kind.biased
        if kind.experts is not None:  # the stacks, their biases and the router
            n += sum(1 + g.bias for g in kind.experts.gemms) + 1
        return n
    return int(all_layers(s, per_layer)) + 2 + (0 if m.tie_word_embeddings else 1)


def _state_shards(s: StepInputs) -> int:
    return s.gpus if s.gpus > 1 and s.sharding in SHARDS_STATES else 1


@term("optimizer", per="step", label="optimizer step")
def optimizer(s: StepInputs) -> float:
    """The update by implementation (optimizer_bytes_per_param) and the gradient-norm clip; each GPU
    updates its shard under ZeRO/FSDP; with CPU offload the update runs on the host (offload term)."""
    if s.plan.offload != "none":
        return 0.0
    spec, tb, n = _optimizer_spec(s), s.trainable_bytes, s.pb.trainable / _state_shards(s)
    tensors = trainable_tensors(s)
    chunks = math.ceil(tensors / s.k["foreach_chunk_tensors"])
    if s.plan.updates_in_backward:
        # stepped per parameter from a backward hook, no gradient norm to clip against (torchtune
        # optimizer_in_bwd; LOMO, Lv et al. 2023 §3): the update's bytes, one launch group per tensor
        return stream_seconds(s, n * (spec["per_trainable_byte"] * tb + spec["extra"])) + \
            spec["ops"] * tensors * s.k["cpu_seconds_per_op"]
    nbytes = n * (spec["per_trainable_byte"] * tb + spec["extra"]) + s.k["grad_clip_passes"] * n * tb
    launches = spec["ops"] * (tensors if spec["per_tensor_loop"] else chunks)
    launches += 3 * chunks  # clip: norms, total, scale
    return stream_seconds(s, nbytes) + launches * s.k["cpu_seconds_per_op"]


@term("grad_accumulation", per="step", label="gradient accumulation")
def grad_accumulation(s: StepInputs) -> float:
    """Each micro-batch after the first adds its gradients into .grad (AccumulateGrad: read, read,
    write)."""
    if s.plan.grad_accum <= 1:
        return 0.0
    return stream_seconds(s, (s.plan.grad_accum - 1) * 3 * s.pb.trainable / _state_shards(s) * s.trainable_bytes)


@term("step_fixed", per="step", kind="cpu", label="per-step overhead")
def step_fixed(s: StepInputs) -> float:
    """Per optimizer step host work of the training loop (scheduler, logging, zero_grad)."""
    return s.k["step_fixed_seconds"]


@term("offload", per="step", kind="link", label="CPU offload link")
def offload(s: StepInputs) -> float:
    """ZeRO-Offload: gradients out and updated bf16 parameters back over the host link every
    step, the Adam update on the CPU (Ren et al. 2021 §4.2); ZeRO-3 parameter offload also
    fetches every parameter from the host for each forward, backward and recomputation
    (Rajbhandari et al. 2021, ZeRO-Infinity §5). FSDP's CPU offload copies each rank's shard of every unit to the GPU
    for its forward and again for its backward (the recomputation runs inside the gathered unit), sends the gradient
    shards to the host, and steps torch's AdamW there (counted at the same CPU rate, an assumption: torch's fused
    CPU AdamW is vectorized as DeepSpeed's CPU Adam is)."""
    plan = s.plan
    if plan.offload == "none":
        return 0.0
    n = s.pb.trainable / _state_shards(s)
    # the CPU optimizer's rate is one socket's: the ranks of a node share its sockets
    adam = s.k["cpu_adam_params_per_s"] * min(s.gpus, s.k["cpu_sockets_per_node"]) / s.gpus
    if plan.offload == "fsdp_cpu":
        stored = weight_bytes(s.model, plan, s.pb)[0] + s.pb.adapter * 4
        return plan.grad_accum * 2 * stored / _state_shards(s) / s.host_link + n * 4 / s.host_link + n / adam
    t = plan.grad_accum * n * 2 / s.host_link + n * 2 / s.host_link + n / adam
    if plan.offload == "zero3_cpu":
        passes = 2 + s.checkpointed_fraction
        t += plan.grad_accum * passes * s.model.params_total * s.act_bytes / _state_shards(s) / s.host_link
    return t


@term("sequence_parallel", kind="link", label="sequence-parallel exchange")
def sequence_parallel_exchange(s: StepInputs) -> float:
    """A sequence-parallel rank's exchange around attention, per micro-batch, over the GPUs' peer link (neither
    overlaps compute: ALST's all-to-alls block, and accelerate's context parallel all-gathers by default):

    - Ulysses: an all-to-all of q, k, v and of the output per attention layer, forward and backward (and the
      recomputation), each rank sending (P-1)/P of its shard (Jacobs et al. 2023, DeepSpeed-Ulysses §3.1);
    - ring: k and v all-gathered per attention layer in forward, again in backward, and their gradients
      reduce-scattered ((P-1)/P of the whole sequence's k/v each; torch context parallel, cp_comm_strategy allgather).
    """
    degree, backend = s.stack.get("sequence_parallel", (1, "ulysses"))
    if degree <= 1:
        return 0.0
    m, plan = s.model, s.plan
    tokens = plan.micro_batch * plan.seq_len  # the rank's shard
    attends = sum(kind.count for kind in s.kinds if kind.attention != "linear")
    share = (degree - 1) / degree
    if backend == "ulysses":
        replicated = max(1, degree // m.num_kv_heads)
        per_pass = share * tokens * (2 * m.q_dim + 2 * replicated * m.kv_dim) * s.act_bytes
        passes = 2 + s.checkpointed_fraction
    else:
        per_pass = share * degree * tokens * 2 * m.kv_dim * s.act_bytes
        passes = 3 + s.checkpointed_fraction
    return attends * passes * per_pass / s.interconnect


@term("collectives", per="step", kind="link", label="collectives")
def collectives(s: StepInputs) -> float:
    """Ring collectives move (N-1)/N of the buffer per GPU (ZeRO §7.2). DDP all-reduces gradients
    once per step (no_sync while accumulating); ZeRO-2/3 and FSDP reduce-scatter them every
    micro-batch; ZeRO-3/FSDP all-gather parameters for forward and backward (DeepSpeed also for
    the recomputation). Only the share not hidden behind compute counts: the gradients' reduction overlaps the
    backward that makes them (Li et al. 2020, PyTorch Distributed §3.2.3: bucketed all-reduce during backward), at
    most comm_exposed's hidden share of it and never more than that backward's own time (DDP: the last
    micro-batch's; the reduce-scatters of ZeRO and FSDP: each micro-batch's); the gathers and ZeRO-2's all-gather of
    the updated shards at comm_exposed."""
    n = s.gpus
    if n <= 1:
        return 0.0
    plan, ring = s.plan, (n - 1) / n
    grad_b = 4 if plan.peft else s.trainable_bytes
    grads = s.pb.trainable * grad_b
    reduced = 2 * grads if s.sharding == "ddp" else plan.grad_accum * grads  # all-reduce = reduce-scatter + gather
    gathered = 0.0
    if s.sharding == "zero2":
        gathered += s.pb.trainable * s.trainable_bytes  # updated shards all-gathered once per step
    if s.sharding in SHARDS_PARAMETERS:
        passes = 2 + (s.checkpointed_fraction if s.sharding == "zero3" else 0.0)
        # the stored bytes of a PEFT run's base (4-bit weights in their float quant storage) and its adapters
        stored = (weight_bytes(s.model, plan, s.pb)[0] + s.pb.adapter * 4) if plan.peft \
            else s.model.params_total * s.act_bytes
        gathered += plan.grad_accum * passes * stored
    exposed = s.k["comm_exposed"].get(s.sharding, 1.0)
    reduce_time = ring * reduced / s.interconnect
    window = backward_gemm_seconds(s) * (1 if s.sharding == "ddp" else plan.grad_accum)
    hidden = min((1 - exposed) * reduce_time, window)
    return reduce_time - hidden + exposed * ring * gathered / s.interconnect


def backward_gemm_seconds(s: StepInputs) -> float:
    """One micro-batch's backward GEMMs (input and weight gradients of every decoder layer): the compute a gradient
    reduction can hide behind."""
    return all_layers(s, lambda s, kind: layer_gemm_seconds(s, "dx", kind) + layer_gemm_seconds(s, "dw", kind))
