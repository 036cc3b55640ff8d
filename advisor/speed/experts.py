"""Routed experts in the step time: grouped expert matmuls at their real per-expert row count, the load of each
expert, the router and the token permutation. Pure arithmetic over ``StepInputs``; no torch.

What transformers runs (``integrations/moe.py`` ``grouped_mm_experts_forward``, the default experts implementation
of every MoE class in transformers 5.24): the router's logits (tokens x experts), softmax and top-k; the tokens x
top-k routed rows sorted by expert and gathered (``hidden_states[perm // top_k]``); two grouped matmuls over those
rows (gate_up, then down), each expert's rows against its own weight; the routing weights multiplied in, the rows
put back in token order and summed over top-k.

The rows each expert receives. Under a uniform router (the balance the load-balancing loss aims at: Fedus et al.
2021, Switch Transformer §2.2) the tokens x top-k assignments fall on the experts as a multinomial: each expert's
load is Binomial(rows, 1/experts), mean rows / experts (128 rows for 2,048 tokens, top-8 of 128). A grouped matmul
on one GPU runs every expert's rows (the CUTLASS grouped GEMM schedules the tiles of all groups over the SMs; the
fallbacks loop over the experts), so its time is the sum over experts of each one's matmul at its own row count,
each at the small-M efficiency of the shape rule (NVIDIA Matrix Multiplication Background guide: tile and wave
quantization), and an expert that gets no row costs nothing. The expected sum is taken over the binomial load
(quantiles of its distribution), so the imbalance shows where it costs on one GPU: idle experts skip their weight
read, busy ones run closer to the large-matmul rate, rows are tiled per expert. The busiest expert sets the time
only where experts run in lock step, i.e. expert parallelism over several GPUs, where the all-to-all waits for
the most loaded rank: ``expected_max_load`` (the balls-into-bins maximum, Raab & Steger 1998) gives that load for
the reports; the advisor plans no expert parallelism.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

from advisor.speed.inputs import StepInputs
from advisor.speed.kernels import gemm_seconds, stream_seconds
from advisor.speed.layers import LayerKind, RoutedExperts

LOAD_QUANTILES = 32
"""Quantiles of the per-expert load the expected grouped-matmul time is averaged over."""


@lru_cache(maxsize=4096)
def expert_loads(rows: int, experts: int, quantiles: int = LOAD_QUANTILES) -> tuple[int, ...]:
    """Rows of one expert at the midpoints of ``quantiles`` equal-probability slices of Binomial(rows, 1/experts):
    the load distribution of a uniform router (exact binomial for a mean under 30 rows, the normal approximation
    with continuity correction above)."""
    if rows <= 0 or experts <= 0:
        return (0,) * quantiles
    p = 1.0 / experts
    mean = rows * p
    qs = [(j + 0.5) / quantiles for j in range(quantiles)]
    if mean >= 30:
        sd = math.sqrt(rows * p * (1 - p))
        nd = NormalDist(mean, sd)
        return tuple(max(0, min(rows, round(nd.inv_cdf(q)))) for q in qs)
    out, m = [], 0
    pmf = (1 - p) ** rows
    cdf = pmf
    for q in qs:
        while cdf < q and m < rows:
            pmf *= (rows - m) / (m + 1) * p / (1 - p)
            m += 1
            cdf += pmf
        out.append(m)
    return tuple(out)


def expected_max_load(rows: int, experts: int) -> float:
    """Expected rows of the busiest expert under a uniform router: mean + sqrt(2 mean ln E) for a mean well above
    ln E (Raab & Steger 1998, "Balls into Bins - A Simple and Tight Analysis", Theorem 1). What sets the time when
    experts run in lock step (expert parallelism); on one GPU the sum over experts does (module docstring)."""
    if rows <= 0 or experts <= 1:
        return float(rows)
    mean = rows / experts
    return mean + math.sqrt(2 * mean * math.log(experts))


def grouped_gemm_seconds(s: StepInputs, rows: int, experts: int, n: int, k: int, which: str) -> float:
    """One grouped expert matmul over ``rows`` routed rows: the sum over experts of each one's GEMM at its own row
    count (expected over the binomial load). ``which``: ``fwd`` / ``dx`` (rows x k @ k x n; the input gradient is
    the same shape with n and k swapped by the caller) or ``dw`` (the weight gradient, n x rows_e x k per expert:
    its inner dimension is the expert's rows)."""
    loads = expert_loads(rows, experts)
    eb = 4 if s.expert_dtype == "fp32" else 2
    scale = s.expert_rate_scale
    total = 0.0
    for m in loads:
        if m <= 0:
            continue
        if which == "dw":
            total += gemm_seconds(s, n, k, m, elem_bytes=eb, rate_scale=scale)
        else:
            total += gemm_seconds(s, m, n, k, elem_bytes=eb, rate_scale=scale)
    return experts * total / len(loads)


def routed_rows(s: StepInputs, ex: RoutedExperts) -> int:
    """Rows of the grouped matmuls in one micro-batch: every token's top-k assignments."""
    return s.tokens * ex.top_k


def experts_gemm_seconds(s: StepInputs, kind: LayerKind, which: str) -> float:
    """One MoE layer's expert matmuls and router matmul for one pass: ``fwd``, ``dx`` (input gradients: the
    router's too, the routing weights being differentiable) or ``dw`` (weight gradients: the expert stacks when
    they train, or always under transformers' own loop below sm80, whose backward computes them regardless; the
    router's in a full fine-tune)."""
    ex = kind.experts
    if ex is None:
        return 0.0
    R, E, M, h = routed_rows(s, ex), ex.num_experts, s.tokens, s.model.hidden_size
    total = 0.0
    for g in ex.gemms:
        if which == "fwd":
            total += grouped_gemm_seconds(s, R, E, g.out_features, g.in_features, "fwd")
        elif which == "dx":
            total += grouped_gemm_seconds(s, R, E, g.in_features, g.out_features, "dx")
        elif s.experts_train or s.experts_path == "transformers_loop":
            total += grouped_gemm_seconds(s, R, E, g.out_features, g.in_features, "dw")
    rb = ex.router_bytes
    rscale = s.k["fp32_simt_ratio"] if rb == 4 and s.plan.activation_dtype != "fp32" else 1.0
    if which == "fwd":
        total += gemm_seconds(s, M, E, h, elem_bytes=rb, rate_scale=rscale)
    elif which == "dx":
        total += gemm_seconds(s, M, h, E, elem_bytes=rb, rate_scale=rscale)
    elif s.full:
        total += gemm_seconds(s, E, h, M, elem_bytes=rb, rate_scale=rscale)
    return total


def experts_elementwise_bytes(s: StepInputs, kind: LayerKind) -> float:
    """Bytes one MoE layer's routing moves in forward, per micro-batch, outside the matmuls (memory-bound; the
    backward moves 1.5x as much, as every elementwise op's: terms.BACKWARD_TRAFFIC).

    Per token: the router's logits written, their fp32 softmax read and written, top-k read (E (2 r + 8), r the
    router dtype's bytes); the load-balancing loss, when the config computes it (``output_router_logits``), its own
    softmax, top-k and sums again (E (p + 12); ``load_balancing_loss_func``). Per routed row (tokens x top-k): the
    permutation (the gathered input written and read, the weighted rows written and read, put back in token order:
    7 p h with the top-k sum's read; integrations/moe.py ``grouped_mm_experts_forward``), each per-expert bias
    gathered and added (3 p per output), and the gated activation over the expert's width
    (expert_gate_bytes_per_width: chunk, act(gate) * up; gpt-oss clamps and gates in more ops)."""
    ex = kind.experts
    if ex is None:
        return 0.0
    p, h, E = s.act_bytes, s.model.hidden_size, ex.num_experts
    per_token = E * (2 * ex.router_bytes + 8)
    if s.model.moe is not None and s.model.moe.output_router_logits:
        per_token += E * (p + 12)
    gate = s.k["expert_gate_bytes_per_width"]
    per_row = 7 * p * h + gate.get(s.model.model_type, gate["default"]) * p * ex.width
    per_row += sum(3 * p * g.out_features for g in ex.gemms if g.bias)
    return s.tokens * per_token + routed_rows(s, ex) * per_row


def expert_lora_seconds(s: StepInputs, kind: LayerKind, which: str) -> float:
    """LoRA on the stacked experts (peft ``lora.ParamWrapper``): every forward folds W + s B A into a new bf16 stack
    per wrapped parameter (``torch.baddbmm`` over the experts: E x (out x r x in), bound by writing the stack and
    reading W; peft/tuners/lora/layer.py ``_LoraFactorsProxy``) and the grouped matmuls run on it; backward takes
    the folded stack's weight gradient (counted with the expert matmuls' ``dw``) and passes it to A and B (two
    narrow batched GEMMs reading that gradient). gate_up_proj's adapter has twice the rank when peft converts the
    config (transformers_weight_conversion.py)."""
    ex = kind.experts
    if ex is None or not s.expert_lora:
        return 0.0
    r, E, eb = s.plan.lora_r, ex.num_experts, (4 if s.expert_dtype == "fp32" else 2)
    total = 0.0
    for g in ex.gemms:
        rank = 2 * r if g.name.startswith("gate_up") else r
        fold = E * gemm_seconds(s, g.out_features, g.in_features, rank, elem_bytes=eb)
        fold = max(fold, stream_seconds(s, E * g.out_features * g.in_features * 2 * eb))
        if which == "fwd":
            total += fold
        else:
            total += E * (gemm_seconds(s, g.out_features, rank, g.in_features, elem_bytes=eb)
                          + gemm_seconds(s, rank, g.in_features, g.out_features, elem_bytes=eb))
    return total


def experts_launches(s: StepInputs, kind: LayerKind) -> float:
    """Eager ops of one MoE layer's forward outside the expert loop: the router's and the routing's
    (ops_per_layer ``moe``)."""
    return float(s.k["ops_per_layer"]["moe"]) if kind.experts is not None else 0.0


def expert_loop_exposed_seconds(s: StepInputs, kind: LayerKind, which: str) -> float:
    """Host time the per-expert loop leaves exposed in one pass (``fwd``, ``dx`` or ``dw``) of one MoE layer, on a
    card without the grouped GEMM: each grouped matmul copies the expert offsets to the host (one synchronization:
    GroupedMMUtils.h ``offs.cpu()``, moe.py ``offs.tolist()``), which drains the queue, then launches one matmul per
    expert; the launches hide behind the matmuls only where each one runs longer than its launch
    (cpu_seconds_per_op), so what shows is max(0, launches x cpu_seconds_per_op - the matmuls' time)."""
    ex = kind.experts
    if ex is None or s.experts_path == "grouped":
        return 0.0
    if which == "dw" and not (s.experts_train or s.experts_path == "transformers_loop"):
        return 0.0
    R, E, cpu = routed_rows(s, ex), ex.num_experts, s.k["cpu_seconds_per_op"]
    active = sum(1 for m in expert_loads(R, E) if m > 0) / LOAD_QUANTILES * E
    total = 0.0
    for g in ex.gemms:
        n, k = (g.out_features, g.in_features) if which != "dx" else (g.in_features, g.out_features)
        gpu = grouped_gemm_seconds(s, R, E, n, k, "dw" if which == "dw" else "fwd")
        total += max(0.0, (active + 1) * cpu - gpu)
    return total
