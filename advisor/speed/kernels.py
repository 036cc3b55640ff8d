"""Time of the kernels a training step is made of: GEMMs by shape, attention by implementation,
and streaming (memory-bound) traffic. Pure arithmetic over ``StepInputs``; no torch.
"""

from __future__ import annotations

from advisor.speed.inputs import StepInputs


def gemm_seconds(s: StepInputs, m: float, n: float, k: float, elem_bytes: float | None = None) -> float:
    """One (m x k) @ (k x n) GEMM: the slower of its compute and its memory traffic (roofline).

    Efficiency falls with the smallest dimension, d / (d + matmul_half_dim): a skinny GEMM (few
    tokens, or a LoRA rank) leaves tiles and SMs idle (NVIDIA Matrix Multiplication Background
    guide: tile and wave quantization) and a LoRA matmul is bound by reading its m x k input."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    p = s.act_bytes if elem_bytes is None else elem_bytes
    d = min(m, n, k)
    efficiency = d / (d + s.k["matmul_half_dim"])
    compute = 2.0 * m * n * k / (s.matmul_flops * efficiency)
    traffic = p * (m * k + k * n + m * n) / s.mem_bw  # read both operands, write the output
    return max(compute, traffic)


def stream_seconds(s: StepInputs, nbytes: float) -> float:
    """Memory-bound kernels moving ``nbytes`` (reads + writes) at the streaming bandwidth."""
    return nbytes / s.mem_bw


def attention_seconds(s: StepInputs) -> tuple[float, float]:
    """(forward, backward) seconds of one decoder layer's attention core for one micro-batch."""
    m, plan = s.model, s.plan
    b, seq, hd, heads = plan.micro_batch, plan.seq_len, m.head_dim, m.num_heads
    impl = plan.attn_impl if plan.attn_impl in s.k["attention_efficiency"] else "sdpa"
    if impl == "eager":
        # two batched GEMMs (Q K^T, P V) over the full s x s scores, no causal skipping, then
        # four in backward (transformers eager_attention_forward; matmul autograd)
        g = b * heads * (gemm_seconds(s, seq, seq, hd) + gemm_seconds(s, seq, hd, seq))
        scores = b * heads * seq * seq
        fwd = g + stream_seconds(s, scores * s.k["eager_score_bytes"]["forward"])
        bwd = 2 * g + stream_seconds(s, scores * s.k["eager_score_bytes"]["backward"])
        return fwd, bwd
    # fused kernels: 4 b s^2 d_q FLOPs, half of them skipped by the causal mask (Dao 2023, §3.1)
    flops = 4.0 * b * seq * seq * heads * hd * 0.5 * s.stack.get("attention_scale", 1.0)  # packed: per document
    eff = s.k["attention_efficiency"][impl]
    shape = seq / (seq + s.k["attention_half_seq"])
    fwd = flops / (s.peak_flops * eff["forward"] * shape)
    bwd = flops * s.k["flash_backward_flops_ratio"] / (s.peak_flops * eff["backward"] * shape)
    return fwd, bwd
