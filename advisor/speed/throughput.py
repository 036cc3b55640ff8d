"""Predicted training throughput: a step-time model made of terms (labelled "predicted", or
"calibrated (N probes)" once real probes on this GPU model refit its scales).

    step seconds = grad_accum x (sum of the per-micro-batch terms) + (sum of the per-step terms)
    tokens/s     = gpus x micro_batch x seq_len x grad_accum / step seconds

The terms (``advisor/speed/terms.py``), each with its citation there:

    matmul             base-linear and lm_head GEMMs, efficiency by shape (small M reaches less)
    attention          by implementation (sdpa, flash_attention_2, eager) and sequence length
    elementwise        norms, activations, rotary, residuals (memory-bound)
    lora               the narrow LoRA matmuls and their cast / dropout / scale-add paths (DoRA's norm)
    loss               the cross-entropy over the vocabulary (fp32 upcast, log-softmax, backward)
    autocast_cast      mixed precision: the fp32 linear weights cast to the compute dtype each forward
    recompute          the forward again for checkpointed layers
    dequant            4-bit / 8-bit weights dequantized in forward and backward
    launch_overhead    host time of the eager ops of a micro-batch
    optimizer          the update by implementation (foreach, fused, 8-bit, paged) + grad clipping
    grad_accumulation  adding each micro-batch's gradients
    step_fixed         per-step host work of the training loop
    offload            host link and CPU Adam under ZeRO-Offload
    collectives        gradient reduction and parameter gathers between GPUs
    low_rank_projection, activation_offload, paged_spill  (``low_rank_and_offload_terms.py``)
    chunked_loss_recompute  the chunked loss's head GEMM again in backward (``chunked_loss_terms.py``)

Constants: ``advisor/data/throughput.yaml`` (source and whether fitted beside each); GPU figures:
``advisor/data/gpus.yaml``. A measured probe always replaces the prediction for its plan.

Adding a term for a new lever (e.g. a new optimizer, activation offload):

1. write ``def my_term(s: StepInputs) -> float`` in ``terms.py`` returning seconds, read the
   lever from ``s.plan`` (a Plan field), and put a one-line citation in its docstring;
2. decorate it ``@term("my_term", per="micro_batch" | "step", kind="gpu" | "cpu" | "link",
   label="what a person reads")``: it then appears in ``ThroughputPrediction.terms``, in
   ``advisor estimate`` and in the tuner's explanations;
3. put any constant in ``throughput.yaml`` with its source (``fitted: true`` if you fit it);
   work a checkpointed layer repeats belongs in ``layer_forward_seconds`` too;
4. add a unit test that the term moves the way its citation says.
A new optimizer (declared in ``advisor/data/optimizers.yaml``) needs its own row in ``optimizer_bytes_per_param``,
and a new attention implementation its row in ``attention_efficiency`` (``inputs.LEVER_ROWS``): a value without
one is an error when throughput.yaml loads, never another value's row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.packed_docs import packed_attention_scale, varlen_attention_scale
from advisor.core.plan import FLASH_ATTENTION, Plan, has_vision_input
from advisor.memory.sequence_parallel import rank_plan
from advisor.memory.sharding import DEFAULT_SHARDING
from advisor.speed.inputs import StepInputs
from advisor.speed import low_rank_and_offload_terms  # noqa: F401 - registers low_rank_projection, activation_offload, paged_spill
from advisor.speed import chunked_loss_terms  # noqa: F401 - registers the chunked loss's recompute term
from advisor.speed import vision_terms  # noqa: F401 - registers the vision tower's term
from advisor.speed import tiled_mlp_terms  # noqa: F401 - registers the tiled MLP's term
from advisor.speed.calibration import for_gpu
from advisor.speed.terms import TERMS, evaluate_terms, kind_lora_modules

COMPUTE = ("matmul", "attention", "recompute", "chunked_loss_recompute")
MEMORY = ("elementwise", "lora", "loss", "autocast_cast")
OPTIMIZER = ("optimizer", "grad_accumulation", "low_rank_projection")
OFFLOAD = ("offload", "activation_offload", "paged_spill")


@dataclass(frozen=True)
class ThroughputPrediction:
    tokens_per_s: float
    """Tokens per second of the whole job (all data-parallel GPUs), padding included."""
    step_seconds: float
    """Seconds per optimizer step (grad_accum micro-batches)."""
    flops_per_step: float
    """Matmul and attention FLOPs of one step on one GPU (recomputation included)."""
    compute_seconds: float
    """matmul + attention + recompute."""
    memory_seconds: float
    """elementwise + lora + loss + autocast_cast (memory-bound work)."""
    dequant_seconds: float
    optimizer_seconds: float
    """optimizer + grad_accumulation + low_rank_projection."""
    offload_seconds: float
    """offload + activation_offload + paged_spill (host-link traffic)."""
    gpu: str
    comm_seconds: float = 0.0
    source: str = "predicted"
    """predicted, or calibrated (N probes) once probes on this GPU model refit its scales."""
    terms: dict[str, float] = field(default_factory=dict)
    """Seconds per optimizer step of each term (they add up to step_seconds)."""
    real_token_fraction: float = 1.0
    """Real tokens / tokens computed on (padding excluded: a data profile without packing)."""

    def to_dict(self) -> dict:
        return asdict(self)

    def largest_terms(self, n: int = 4) -> list[tuple[str, float]]:
        """The n terms that take the most time, largest first, as (name, seconds per step)."""
        return sorted(((k, v) for k, v in self.terms.items() if v > 0), key=lambda kv: -kv[1])[:n]


def term_labels() -> dict[str, str]:
    """name -> the label a person reads (the GRPO/DPO phases' too: advisor.speed.rl)."""
    from advisor.speed.rl import RL_TERM_LABELS

    return {**{t.name: t.label for t in TERMS}, **RL_TERM_LABELS}


def step_flops(model: ModelSpec, plan: Plan, s: StepInputs | None = None) -> float:
    """Matmul FLOPs of one step (all micro-batches): 2 per weight per token forward, as much for
    input gradients, again for weight gradients where weights train (Kaplan et al. 2020 §2.1), the
    forward again under checkpointing (Chen et al. 2016), causal attention 2 s (d_qk + d_v) / 2 per head per token
    forward (over the window where the kernel skips the rest) and 2.5x that backward (Dao 2023 §3.1). A routed
    layer counts its expert matmuls for tokens x top-k (every expert resident, each token visiting top-k) and its
    router for every token; a Gated DeltaNet layer its chunked scan (kernels.linear_attention_seconds)."""
    from advisor.speed.kernels import attended_keys, attention_dims

    s = s or StepInputs(model, plan, _NO_GPU)
    M = s.tokens
    head = model.hidden_size * model.vocab_size
    fwd = bwd = recompute = 0.0
    for kind in s.kinds:
        lin = sum(i * o for _, i, o in kind.linears)
        lora = sum(plan.lora_r * sum(kind.shape(m)) for m in kind_lora_modules(s, kind))
        if kind.attention == "linear":
            la = model.description.linear_attention
            C, heads = s.k["gated_delta_rule_chunk"], max(la.num_value_heads, la.num_key_heads)
            attn = heads * (C * (6 * la.key_head_dim + 4 * la.value_head_dim) + 6 * la.key_head_dim * la.value_head_dim)
            attn_bwd = attn * s.k["gated_delta_rule_backward_ratio"]
        else:
            heads, d_qk, d_v = attention_dims(s, kind)
            share = 2 * attended_keys(s, kind, "flash_attention_2")  # useful pairs: causal, within the window
            attn = plan.seq_len * heads * (d_qk + d_v) * share
            attn_bwd = 2.5 * attn
        experts = routed = 0.0
        if kind.experts is not None:
            ex = kind.experts
            experts = ex.top_k * sum(g.in_features * g.out_features for g in ex.gemms)
            routed = ex.num_experts * model.hidden_size  # the router's logits
        fwd_layer = 2 * M * (lin + lora + experts + routed) + M * attn
        fwd += kind.count * fwd_layer
        bwd_layer = 2 * M * (lin + experts + routed) + 4 * M * lora + M * attn_bwd
        if plan.method == "full":
            bwd_layer += 2 * M * (lin + experts + routed)
        elif s.expert_lora:
            bwd_layer += 2 * M * experts  # the folded stacks' weight gradient
        bwd += kind.count * bwd_layer
        recompute += kind.count * fwd_layer
    fwd += 2 * M * head
    bwd += 2 * M * head + (2 * M * head if plan.method == "full" else 0)
    return float(plan.grad_accum * (fwd + bwd + s.checkpointed_fraction * recompute))


_NO_GPU = GpuSpec(key="none", name="none", memory_bytes=0, bf16=True, bf16_tflops=1.0, fp16_tflops=1.0,
                  mem_bw_gbs=1.0, host_link_gbs=1.0, source="placeholder for FLOP counting")


def predict_throughput(model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int = 1, sharding: str = DEFAULT_SHARDING,
                       calibrated: bool = True, k: dict | None = None,
                       stack: dict | None = None, data: Any = None) -> ThroughputPrediction:
    """Tokens per second of the whole job (all ``gpus`` data-parallel replicas) and its terms.

    ``calibrated``: apply the per-GPU scales refit from earlier real probes on this GPU model,
    when there are any (advisor/speed/calibration.py); the source then says so. ``k`` replaces the
    constants of throughput.yaml and ``stack`` states another software stack's differences (both
    for the published-runs benchmark). ``data`` (a data profile: ``lengths``, ``expected_padded``,
    ``mean_tokens``) counts real tokens only: an average batch is padded to its longest document
    unless packed, and packed attention runs over each document's own block.

    A GRPO or DPO plan is timed phase by phase (advisor.speed.rl): its terms are the training step's and one per
    phase (generate, score, sync, vllm_sleep; reference_forward), its tokens/s GRPO's completion tokens (DPO's chosen
    and rejected tokens)."""
    if plan.task != "sft":
        return _rl_prediction(model, plan, gpu, gpus, sharding)
    frac, stack = 1.0, dict(stack or {})
    if plan.packing:  # flash varlen: each document's own block; sdpa / eager: the whole masked seq^2 (kernels)
        stack.setdefault("attention_scale", packed_attention_scale(list(data.lengths), plan.seq_len)
                         if data is not None and plan.attn_impl in FLASH_ATTENTION else varlen_attention_scale(plan))
    if data is not None:
        if not plan.packing:
            padded = max(1, round(data.expected_padded(plan.seq_len, plan.micro_batch)))
            frac = min(1.0, data.mean_tokens(plan.seq_len) / padded)
            plan = plan.with_(seq_len=padded)
    if model.vision is not None and has_vision_input(plan):  # the language model's sequence holds the image tokens
        from advisor.core.vision_tokens import count_sample

        vis = count_sample(model, plan)
        if vis is not None and vis.text_tokens:
            plan = plan.with_(seq_len=plan.seq_len + vis.text_tokens)
    if plan.sp_degree > 1:
        # one rank's step: its shard of the sequence through every linear layer; attention over the whole sequence
        # with heads / P heads, P times the shard's attention FLOPs (Jacobs et al. 2023, DeepSpeed-Ulysses §3)
        stack["attention_scale"] = stack.get("attention_scale", 1.0) * plan.sp_degree
        stack["sequence_parallel"] = (plan.sp_degree, plan.sp_backend)
        plan = rank_plan(plan)
    s = StepInputs(model, plan, gpu, gpus, sharding, k, stack)
    raw = evaluate_terms(s)
    source, scale = "predicted", {"gpu": 1.0, "cpu": 1.0, "link": 1.0}
    if calibrated:
        cal = for_gpu(gpu)
        if cal is not None:
            source, scale = cal.label, {"gpu": cal.gpu_scale, "cpu": cal.cpu_scale, "link": 1.0}
    terms = {name: sec * scale[kind] for name, (sec, kind) in raw.items()}
    step = max(sum(terms.values()), 1e-9)
    return ThroughputPrediction(
        tokens_per_s=gpus * plan.tokens_per_step * frac / step, step_seconds=step,
        flops_per_step=step_flops(model, plan, s),
        compute_seconds=sum(terms[n] for n in COMPUTE if n in terms),
        memory_seconds=sum(terms[n] for n in MEMORY if n in terms),
        dequant_seconds=terms.get("dequant", 0.0),
        optimizer_seconds=sum(terms[n] for n in OPTIMIZER if n in terms),
        offload_seconds=sum(terms[n] for n in OFFLOAD if n in terms), gpu=gpu.name,
        comm_seconds=terms.get("collectives", 0.0), source=source, terms=terms,
        real_token_fraction=frac)


def _rl_prediction(model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int, sharding: str) -> ThroughputPrediction:
    from advisor.memory.rl import step_plan
    from advisor.speed.rl import rl_terms

    terms, times = rl_terms(model, plan, gpu, rl_train_step(model, plan, gpu, gpus, sharding), gpus, sharding)
    inner = step_plan(plan)
    train = {n: terms.get(n, 0.0) for n in terms if n not in times.phases}
    return ThroughputPrediction(
        tokens_per_s=times.completion_tokens_per_s, step_seconds=times.step_seconds,
        flops_per_step=step_flops(model, inner), compute_seconds=sum(train.get(n, 0.0) for n in COMPUTE),
        memory_seconds=sum(train.get(n, 0.0) for n in MEMORY), dequant_seconds=train.get("dequant", 0.0),
        optimizer_seconds=sum(train.get(n, 0.0) for n in OPTIMIZER),
        offload_seconds=sum(train.get(n, 0.0) for n in OFFLOAD), gpu=gpu.name,
        comm_seconds=train.get("collectives", 0.0), source="predicted", terms=terms)


def rl_times(model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int = 1, sharding: str = DEFAULT_SHARDING):
    """The phases' seconds of a GRPO / DPO step (advisor.speed.rl.RlTimes)."""
    from advisor.speed.rl import predict_rl

    return predict_rl(model, plan, gpu, rl_train_step(model, plan, gpu, gpus, sharding), gpus, sharding)


def rl_train_step(model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int, sharding: str) -> ThroughputPrediction:
    """The training step of a GRPO / DPO plan as the SFT step-time model times it: the rows and tokens the ledger
    counts (advisor.memory.rl_head.step_plan), TRL's fused head priced as the fused-linear loss."""
    from advisor.memory.rl_head import step_plan

    return predict_throughput(model, step_plan(plan).with_(loss="fused-linear"), gpu, gpus, sharding)
