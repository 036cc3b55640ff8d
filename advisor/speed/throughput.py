"""Predicted training throughput from a roofline of the GPU (labelled "predicted").

time per step = max(matmul FLOPs / achievable FLOP/s, bytes / achievable bandwidth)
                + 4-bit dequantization traffic + optimizer traffic + host-link traffic (offload)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

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
    levers_seconds: float = 0.0
    """The loss, DoRA and eager-attention kernels (advisor.speed.levers)."""
    real_token_fraction: float = 1.0
    """Real tokens / tokens computed on (padding excluded: --data without packing)."""
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
    recompute = fwd if plan.gradient_checkpointing else 0  # one more forward per layer (Chen et al. 2016)
    return fwd + bwd_input + bwd_weight + adapters + recompute


def predict_throughput(model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int = 1,
                       sharding: str = "ddp", data=None) -> ThroughputPrediction:
    """Tokens per second of the whole job (all ``gpus`` data-parallel replicas); with ``data`` (a
    DataProfile) real tokens only: an average batch is padded to its longest document unless packed."""
    if data is not None and not plan.packing:
        # time an average padded batch (E[max] of micro_batch lengths), count only its real tokens
        padded = max(1, round(data.expected_padded(plan.seq_len, plan.micro_batch)))
        base = predict_throughput(model, plan.with_(seq_len=padded), gpu, gpus, sharding)
        frac = data.mean_tokens(plan.seq_len) / padded
        return replace(base, tokens_per_s=base.tokens_per_s * frac, real_token_fraction=frac)
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
    passes = (3 if plan.gradient_checkpointing else 2) * plan.grad_accum  # forward, backward (+ recompute)
    weight_b = DTYPE_BYTES[plan.param_dtype]
    # every pass reads every weight once (memory-bound at small batch)
    memory = passes * (pb.linear * (0.5 if plan.four_bit else 1 if plan.quantized else weight_b)
                       + pb.other * weight_b) / bw
    dequant = passes * pb.linear * a["dequant_bytes_per_param"] / bw if plan.four_bit else 0.0
    tb = trainable_dtype_bytes(plan)
    state_b = {"adamw_torch": 2 * tb, "paged_adamw_32bit": 8, "adamw_8bit": 2, "paged_adamw_8bit": 2,
               "adafactor": 0.1 * tb, "sgd": 0}[plan.optimizer]
    # the optimizer reads and writes parameters and states, reads gradients
    optimizer = pb.trainable * (2 * tb + tb + 2 * state_b) / bw
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
    levers_s = _lever_seconds(model, plan, data, peak_tflops * 1e12 * a["matmul_efficiency"], bw)
    step = max(compute, memory) + dequant + optimizer + offload + comm + levers_s
    return ThroughputPrediction(
        tokens_per_s=gpus * plan.tokens_per_step / step, step_seconds=step, flops_per_step=flops,
        compute_seconds=compute, memory_seconds=memory, dequant_seconds=dequant, optimizer_seconds=optimizer,
        offload_seconds=offload, gpu=gpu.name, comm_seconds=comm, levers_seconds=levers_s)


def _lever_seconds(model: ModelSpec, plan: Plan, data, flops_per_s: float, bytes_per_s: float) -> float:
    """The levers' own kernels, and packed attention's smaller score blocks (advisor.speed.levers)."""
    from advisor.speed.levers import attention_flops_scale, lever_cost

    cost = lever_cost(model, plan)
    scale = attention_flops_scale(list(data.lengths) if data is not None else None, plan)
    # step_flops' attention term, in every pass that runs it (forward, input gradient, weight gradient
    # when full, recompute), shrunk to the documents' own blocks when packed
    attn_passes = 2 + (1 if plan.method == "full" else 0) + (1 if plan.gradient_checkpointing else 0)
    attn = plan.tokens_per_step * 2 * model.num_layers * plan.seq_len * model.q_dim * attn_passes
    return max(0.0, (cost.flops + attn * (scale - 1)) / flops_per_s + cost.bytes / bytes_per_s)
