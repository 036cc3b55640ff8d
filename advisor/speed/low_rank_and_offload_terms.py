"""Step-time terms of low-rank optimizers (GaLore, APOLLO), activation offload, and paged optimizer
states that spill to the host (the update inside backward is ``terms.optimizer``'s).

The optimizer implementations themselves are rows of ``optimizer_bytes_per_param`` in
``advisor/data/throughput.yaml`` (terms.optimizer).
"""

from __future__ import annotations

from advisor.core.plan import LOW_RANK_OPTIMIZERS, PAGED_OPTIMIZERS
from advisor.speed.inputs import StepInputs
from advisor.speed.kernels import gemm_seconds
from advisor.speed.terms import all_layers, layer_forward_seconds, layer_gemm_seconds, term

SVD_EFFICIENCY = 0.05  # a GPU SVD (cuSOLVER gesvd) reaches a few % of the fp32 rate (GaLore's projector)


def _low_rank_targets(s: StepInputs) -> list[tuple[int, int]]:
    """(out, in) of every weight a low-rank optimizer projects: the training ledger's rule."""
    from advisor.memory.training import low_rank_targets

    return list(low_rank_targets(s.model, s.plan))


@term("low_rank_projection", per="step", label="low-rank projection (GaLore/APOLLO)")
def low_rank_projection(s: StepInputs) -> float:
    """GaLore / APOLLO project each target gradient to rank r and the update back: 2 m n r FLOPs each
    way per step (Zhao et al. 2024, GaLore §4); GaLore also recomputes the projector by SVD every
    optim_proj_gap steps: ~4 m n k + 8 k^3 FLOPs, k = min(m, n) (Golub & Van Loan, 4th ed. §8.6.3),
    at the fp32 rate and a GPU SVD's low efficiency, amortized per step."""
    plan = s.plan
    if plan.optimizer not in LOW_RANK_OPTIMIZERS:
        return 0.0
    r = plan.optim_rank
    gap = max(1, plan.optim_proj_gap)
    fp32_peak = s.peak_flops * s.k["fp32_tensor_ratio"]
    total = 0.0
    for m, n in _low_rank_targets(s):
        k = min(m, n)
        rank = min(r, k)
        total += 2 * gemm_seconds(s, rank, n, m, elem_bytes=4)
        if plan.optimizer.startswith("galore"):
            total += (4 * m * n * k + 8 * k ** 3) / gap / (fp32_peak * SVD_EFFICIENCY)
    return total


@term("activation_offload", kind="link", label="activation offload link")
def activation_offload(s: StepInputs) -> float:
    """Offloaded activations cross the host link twice per micro-batch (to the host in forward, back
    in backward). Checkpoint offload (with checkpointing): transformers' save_on_cpu copies each
    checkpointed layer's input with copy_(non_blocking) into pinned memory in pack and .to(device) in
    unpack, both on the compute stream, whose next kernels wait for them (torch/autograd/graph.py
    save_on_cpu: no side stream), so nothing is hidden: 2 x the inputs' bytes / the link.
    Without checkpointing TRL / torchtune activation offloading copies every saved activation on a side
    stream, hidden behind the layers' matmuls (use_streams)."""
    plan = s.plan
    if not plan.activation_offload:
        return 0.0
    if plan.gradient_checkpointing:
        from advisor.memory.training import checkpoint_offload_bytes

        # the inputs' own bytes, not their power-of-two pinned blocks (the copies move the tensors)
        return 2 * checkpoint_offload_bytes(s.model, plan) / s.host_link
    from advisor.memory.rl import step_ledger as estimate_training

    # what the ledger moves to the host: every saved activation of 1 KiB or more (the weight views matmul
    # saves and the loss's log-softmax included)
    offloaded = estimate_training(s.model, plan).host.get("activations", 0)
    window = all_layers(s, lambda s, kind: layer_forward_seconds(s, kind) + layer_gemm_seconds(s, "dx", kind)
                        + layer_gemm_seconds(s, "dw", kind))
    return max(0.0, 2 * offloaded / s.host_link - window)


@term("paged_spill", per="step", kind="link", label="paged optimizer spill")
def paged_spill(s: StepInputs) -> float:
    """Paged optimizer states the GPU cannot hold are evicted to the host and come back for the step:
    twice over the host link per step, page-fault driven (bitsandbytes paged optimizers, unified
    memory); the ledger says how much spills."""
    plan = s.plan
    if plan.optimizer not in PAGED_OPTIMIZERS or plan.offload != "none" or not s.gpu.memory_bytes:
        return 0.0
    if s.pb.trainable * 4 < 0.2 * s.gpu.memory_bytes:
        return 0.0  # states far smaller than the card (LoRA, small models): nothing spills; skip the ledger
    from advisor.memory.rl import step_ledger as estimate_training

    spilled = estimate_training(s.model, plan, s.gpu).host.get("optimizer_states", 0)
    return 2 * spilled / s.host_link
