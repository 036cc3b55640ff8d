"""Time of the kernels a training step is made of: GEMMs by shape, attention by implementation and kind
(full, sliding window, latent, Gated DeltaNet's chunked scan), and streaming (memory-bound) traffic. Pure
arithmetic over ``StepInputs``; no torch.
"""

from __future__ import annotations

from advisor.core.packed_docs import builds_packed_mask
from advisor.core.plan import FLASH_ATTENTION
from advisor.speed.inputs import StepInputs, lever_row
from advisor.speed.layers import LayerKind


def gemm_seconds(s: StepInputs, m: float, n: float, k: float, elem_bytes: float | None = None,
                 rate_scale: float = 1.0) -> float:
    """One (m x k) @ (k x n) GEMM: the slower of its compute and its memory traffic (roofline).

    Efficiency falls with the smallest dimension, d / (d + matmul_half_dim): a skinny GEMM (few
    tokens, or a LoRA rank) leaves tiles and SMs idle (NVIDIA Matrix Multiplication Background
    guide: tile and wave quantization) and a LoRA matmul is bound by reading its m x k input.
    ``rate_scale`` scales the matmul rate (fp32 operands without tensor cores)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    p = s.act_bytes if elem_bytes is None else elem_bytes
    d = min(m, n, k)
    efficiency = d / (d + s.k["matmul_half_dim"])
    compute = 2.0 * m * n * k / (s.matmul_flops * rate_scale * efficiency)
    traffic = p * (m * k + k * n + m * n) / s.mem_bw  # read both operands, write the output
    return max(compute, traffic)


def stream_seconds(s: StepInputs, nbytes: float) -> float:
    """Memory-bound kernels moving ``nbytes`` (reads + writes) at the streaming bandwidth."""
    return nbytes / s.mem_bw


def attention_dims(s: StepInputs, kind: LayerKind) -> tuple[int, int, int]:
    """(heads, query/key width per head, value width per head) of a softmax-attention layer. Multi-head latent
    attention decompresses keys of nope + rope dims and values of v_head_dim per head (transformers
    modeling_deepseek_v2.py: ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim``)."""
    m = s.model
    mla = m.description.mla
    if kind.attention == "mla" and mla is not None:
        return m.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
    return m.num_heads, m.head_dim, m.head_dim


def attended_keys(s: StepInputs, kind: LayerKind, impl: str) -> float:
    """Query-key pairs one sequence's attention computes, in units of seq^2 (0.5: the causal half).

    Causal kernels skip the masked half (Dao 2023 §3.1). A sliding-window layer attends to at most ``window``
    keys per query: w(w+1)/2 + (s - w) w pairs; FlashAttention-2 takes the window (``window_size``) and skips
    the blocks outside it, as flex attention does with its block mask. Under sdpa transformers passes an explicit
    mask once the sequence reaches the window (masking_utils ``_ignore_causal_mask_sdpa`` drops the mask only
    while kv_length < the window), which SDPA's memory-efficient kernel applies to every block: the whole s^2."""
    seq = s.plan.seq_len
    w = kind.window
    if impl == "sdpa" and builds_packed_mask(s.plan):
        # packed documents: an explicit block-diagonal mask and is_causal False; SDPA's flash backend takes no mask
        # (aten sdp_utils.cpp check_for_attn_mask), its memory-efficient kernel reads the bias of every key block
        # (kernel_forward.h bounds the key loop only for a causal custom_mask_type): the whole s^2, none skipped
        return 1.0
    if kind.attention != "sliding" or not w or seq <= w:
        return 0.5
    if impl in FLASH_ATTENTION or impl == "flex_attention":  # FlashAttention-3 takes window_size as FA2 does
        return (w * (w + 1) / 2 + (seq - w) * w) / (seq * seq)
    return 1.0


def attention_seconds(s: StepInputs, kind: LayerKind | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of one decoder layer's attention core for one micro-batch (the first layer
    kind's when none is named)."""
    kind = kind or s.kinds[0]
    if kind.attention == "linear":
        return linear_attention_seconds(s, kind)
    plan = s.plan
    b, seq = plan.micro_batch, plan.seq_len
    heads, d_qk, d_v = attention_dims(s, kind)
    impl = plan.attn_impl
    if impl == "eager":
        # two batched GEMMs (Q K^T, P V) over the full s x s scores, no causal or window skipping, then
        # four in backward (transformers eager_attention_forward; matmul autograd)
        g = b * heads * (gemm_seconds(s, seq, seq, d_qk) + gemm_seconds(s, seq, d_v, seq))
        scores = b * heads * seq * seq
        fwd = g + stream_seconds(s, scores * s.k["eager_score_bytes"]["forward"])
        bwd = 2 * g + stream_seconds(s, scores * s.k["eager_score_bytes"]["backward"])
        return fwd, bwd
    # fused kernels: 2 b s^2 (d_qk + d_v) FLOPs per head (Q K^T and P V), the causal half or the window skipped
    # (Dao 2023, §3.1); packed documents attend only within themselves
    flops = (2.0 * b * seq * seq * heads * (d_qk + d_v) * attended_keys(s, kind, impl)
             * s.stack.get("attention_scale", 1.0))
    eff = lever_row(s, "attention_efficiency")
    # varlen runs each document's block: its tiles fill as a sequence of the documents' token-weighted length does
    L = seq * s.stack.get("attention_scale", 1.0) if plan.packing and impl in FLASH_ATTENTION else seq
    shape = L / (L + s.k["attention_half_seq"])
    fwd = flops / (s.peak_flops * eff["forward"] * shape)
    bwd = flops * s.k["flash_backward_flops_ratio"] / (s.peak_flops * eff["backward"] * shape)
    return fwd, bwd


def linear_attention_seconds(s: StepInputs, kind: LayerKind) -> tuple[float, float]:
    """(forward, backward) seconds of one Gated DeltaNet layer's chunked scan (flash-linear-attention's
    ``chunk_gated_delta_rule``, what transformers' Qwen3-Next calls when the package is installed).

    Per chunk of C tokens and head, the chunkwise form runs K K^T, the WY products T K and T V, the state
    recurrence (v - W S, S += K^T v) and the output (Q S, (Q K^T) v): C^2 (6 d_k + 4 d_v) + 6 C d_k d_v FLOPs, i.e.
    O(C d + d^2) per token (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
    Length", §3; the gates of Gated DeltaNet add elementwise decays only: Yang, Kautz & Hatamizadeh 2025, §3.3).
    Its matmuls are C rows wide (the shape rule at d = C); it writes each chunk's d_k x d_v state to memory
    (``chunk_gated_delta_rule_fwd_h`` stores h for the output kernel and backward) and reads q, k, v, the gates and
    the WY intermediates: at these widths it is bound by that traffic as much as by its FLOPs (roofline of both).
    Backward recomputes the states and runs the transposed products (gated_delta_rule_backward_ratio)."""
    la = s.model.description.linear_attention
    if la is None:
        return 0.0, 0.0
    p, C = s.act_bytes, s.k["gated_delta_rule_chunk"]
    heads = max(la.num_value_heads, la.num_key_heads)  # q and k are repeated to the value heads
    dk, dv = la.key_head_dim, la.value_head_dim
    tokens = s.tokens
    flops = tokens * heads * (C * (6 * dk + 4 * dv) + 6 * dk * dv)
    efficiency = C / (C + s.k["matmul_half_dim"])
    # q, k, v read, o written; w, u, v_new written and read again; the chunk states h (bf16) written and read;
    # the gates and the C x C blocks (fp32) per token
    per_token = heads * (p * (3 * dk + 2 * dv) + 2 * p * (dk + 2 * dv) + 2 * p * dk * dv / C + 4 * (C + 2))
    fwd = max(flops / (s.matmul_flops * efficiency), tokens * per_token / s.mem_bw)
    return fwd, fwd * s.k["gated_delta_rule_backward_ratio"]
