"""Predicted training throughput from a roofline of the GPU (labelled "predicted").

time per step = max(matmul FLOPs / achievable FLOP/s, bytes / achievable bandwidth)
                + 4-bit dequantization traffic + optimizer traffic + host-link traffic (offload)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from advisor.memory.training import param_breakdown, trainable_dtype_bytes
from advisor.core.catalog import GpuSpec, ModelSpec, _load_data
from advisor.core.plan import DTYPE_BYTES, Plan


@dataclass(frozen=True)
class ThroughputPrediction:
    tokens_per_s: float
    step_seconds: float
    flops_per_step: float
    compute_seconds: float
    memory_seconds: float
    dequant_seconds: float
    optimizer_seconds: float
    offload_seconds: float
    gpu: str
    comm_seconds: float = 0.0
    source: str = "predicted"

    def to_dict(self) -> dict:
        return asdict(self)


def step_flops(model: ModelSpec, plan: Plan) -> float:
    """Matmul FLOPs of one optimizer step (all micro-batches)."""
    T = plan.tokens_per_step
    pb = param_breakdown(model, plan)
    matmul_params = pb.linear + model.vocab_size * model.hidden_size  # embeddings do no matmul; lm_head does
    # forward: 2 FLOPs per parameter per token + attention 2·L·s·d_attn (causal half of 4·L·s·d_attn)
    # (Kaplan et al. 2020 §2.1, table 1; Chinchilla appendix F)
    attn = 2 * model.num_layers * plan.seq_len * model.q_dim
    fwd = T * (2 * matmul_params + attn)
    # backward: input gradients cost one forward; weight gradients another, only where weights train
    bwd_input = fwd
    bwd_weight = fwd if plan.method == "full" else T * 2 * pb.adapter
    adapters = T * 2 * pb.adapter * 2  # adapter forward (and its input-gradient path)
    recompute = fwd * recompute_fraction(model, plan)  # one more forward per checkpointed layer (Chen et al. 2016)
    return fwd + bwd_input + bwd_weight + adapters + recompute


def predict_throughput(model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int = 1,
                       sharding: str = "ddp") -> ThroughputPrediction:
    """Tokens per second of the whole job (all ``gpus`` data-parallel replicas)."""
    a = _load_data("throughput.yaml")
    peak_tflops = (gpu.bf16_tflops if plan.activation_dtype == "bf16" and gpu.bf16 else gpu.fp16_tflops)
    if plan.activation_dtype == "fp32":
        peak_tflops = (gpu.bf16_tflops or gpu.fp16_tflops) * a["fp32_tensor_ratio"]
    flops = step_flops(model, plan)
    compute = flops / (peak_tflops * 1e12 * a["matmul_efficiency"])
    if plan.quantization == "int8":
        compute *= a["int8_overhead"]
    bw = gpu.mem_bw_gbs * 1e9 * a["bandwidth_efficiency"]
    pb = param_breakdown(model, plan)
    passes = (2 + recompute_fraction(model, plan)) * plan.grad_accum  # forward, backward (+ recompute)
    weight_b = DTYPE_BYTES[plan.param_dtype]
    # every pass reads every weight once (memory-bound at small batch)
    memory = passes * (pb.linear * (0.5 if plan.four_bit else 1 if plan.quantized else weight_b)
                       + pb.other * weight_b) / bw
    dequant = passes * pb.linear * a["dequant_bytes_per_param"] / bw if plan.four_bit else 0.0
    optimizer = optimizer_traffic_bytes(model, plan) / bw + low_rank_projection_seconds(model, plan, gpu, a)
    offload = 0.0
    if plan.offload != "none":
        link = gpu.host_link_gbs * 1e9 * a["host_link_efficiency"]
        # gradients out, updated parameters back (ZeRO-Offload §4.2), CPU Adam in between
        offload = pb.trainable * 2 * 2 / link + pb.trainable / a["cpu_adam_params_per_s"]
        optimizer = 0.0
        if plan.offload == "zero3_cpu":
            offload += passes * model.params_total * weight_b / link  # parameters gathered from the host each pass
    comm = 0.0
    if gpus > 1:
        from advisor.memory.sharding import comm_bytes_per_step, interconnect_gbs

        # collectives not overlapped with compute (a conservative bound; ZeRO §7.2 volumes)
        comm = comm_bytes_per_step(model, plan, gpus, sharding) / (interconnect_gbs(gpu) * 1e9 * a["host_link_efficiency"])
        if sharding in ("zero2", "zero3", "fsdp"):
            optimizer /= gpus  # each GPU updates its shard
    offload += activation_offload_seconds(model, plan, gpu, a, compute) + paged_spill_seconds(model, plan, gpu, a)
    step = max(compute, memory) + dequant + optimizer + offload + comm
    return ThroughputPrediction(
        tokens_per_s=gpus * plan.tokens_per_step / step, step_seconds=step, flops_per_step=flops,
        compute_seconds=compute, memory_seconds=memory, dequant_seconds=dequant, optimizer_seconds=optimizer,
        offload_seconds=offload, gpu=gpu.name, comm_seconds=comm)



# --------------------------------------------------------------------------- terms of issue 15's levers


def recompute_fraction(model: ModelSpec, plan: Plan) -> float:
    """Share of the forward recomputed in backward: k of L checkpointed layers (Chen et al. 2016)."""
    from advisor.core.plan import checkpointed_layers

    return len(checkpointed_layers(plan, model.num_layers)) / model.num_layers


STATE_BYTES_PER_PARAM = {
    # bytes of optimizer state read and written per trainable parameter, per step
    "adamw_torch": None, "adamw_torch_fused": None,   # two moments in the trainable dtype (torch AdamW)
    "paged_adamw_32bit": 8.0, "adamw_8bit": 2.0, "paged_adamw_8bit": 2.0,  # bitsandbytes fp32 / blockwise 8-bit
    "adamw_torch_8bit": 2.0, "adamw_torch_4bit": 1.0,  # torchao low-bit codes (scales add ~2%)
    "sgd": 0.0, "lomo": 0.0,
}


def optimizer_traffic_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes the optimizer step moves: read gradients, read and write parameters and states.

    foreach AdamW also writes and reads its full-size sqrt temporary (torch _multi_tensor_adamw); the fused
    kernel does not (torch._fused_adamw_). GaLore / APOLLO states are rank-r (their targets' share shrinks by
    r / min(m, n)); Adafactor / AdaLomo keep row and column vectors (~0.1 of a state)."""
    from advisor.memory.training import optimizer_state_bytes

    pb = param_breakdown(model, plan)
    tb = trainable_dtype_bytes(plan)
    n = pb.trainable
    per = STATE_BYTES_PER_PARAM.get(plan.optimizer)
    if plan.optimizer in ("adamw_torch", "adamw_torch_fused"):
        states = 2 * tb * n
    elif per is not None:
        states = per * n
    else:  # adafactor, adalomo, GaLore, APOLLO: what the ledger says they keep
        states = float(optimizer_state_bytes(model, plan, pb))
    foreach_temp = 2 * tb * n if plan.optimizer == "adamw_torch" else 0
    return n * (2 * tb + tb) + 2 * states + foreach_temp


def low_rank_projection_seconds(model: ModelSpec, plan: Plan, gpu: GpuSpec, a: dict) -> float:
    """GaLore's SVD of every target gradient every optim_proj_gap steps, amortized per step, plus the per-step
    projections (2·m·n·r FLOPs each way). A reduced SVD of m x n costs ~4·m·n·k + 8·k^3 FLOPs, k = min(m, n)
    (Golub & Van Loan, 4th ed. §8.6.3), at the fp32 rate with a GPU SVD's low efficiency (cuSOLVER gesvd: ~5%)."""
    from advisor.memory.training import low_rank_targets
    from advisor.core.plan import LOW_RANK_OPTIMIZERS

    if plan.optimizer not in LOW_RANK_OPTIMIZERS:
        return 0.0
    fp32 = (gpu.bf16_tflops or gpu.fp16_tflops) * a["fp32_tensor_ratio"] * 1e12
    proj = svd = 0.0
    for m, n in low_rank_targets(model, plan):
        k = min(m, n)
        proj += 2 * 2 * m * n * min(plan.optim_rank, k)
        if plan.optimizer.startswith("galore"):
            svd += 4 * m * n * k + 8 * k ** 3
    return proj / (fp32 * a["matmul_efficiency"]) + svd / plan.optim_proj_gap / (fp32 * 0.05)


def activation_offload_seconds(model: ModelSpec, plan: Plan, gpu: GpuSpec, a: dict, compute: float) -> float:
    """PCIe time of activation offload that compute does not hide.

    Every offloaded byte crosses the host link twice (device to host in forward, back in backward). With
    checkpointing, transformers' save_on_cpu copies on the compute stream: nothing is hidden. Without, TRL's
    OffloadActivations copies on a side stream and overlaps them with compute (use_streams)."""
    if not plan.activation_offload:
        return 0.0
    from advisor.memory.training import estimate_training

    host = estimate_training(model, plan).host.get("activations", 0)
    link = gpu.host_link_gbs * 1e9 * a["host_link_efficiency"]
    pcie = 2 * host * plan.grad_accum / link
    if plan.gradient_checkpointing:
        return pcie
    return max(0.0, pcie - compute)


def paged_spill_seconds(model: ModelSpec, plan: Plan, gpu: GpuSpec, a: dict) -> float:
    """Paged optimizer states evicted to the host come back for the step and go out again: twice over the host
    link per step, page-fault driven (no overlap with compute)."""
    from advisor.core.plan import PAGED_OPTIMIZERS

    if plan.optimizer not in PAGED_OPTIMIZERS:
        return 0.0
    from advisor.memory.training import estimate_training

    spilled = estimate_training(model, plan, gpu).host.get("optimizer_states", 0)
    return 2 * spilled / (gpu.host_link_gbs * 1e9 * a["host_link_efficiency"])
