"""Time per step of GRPO and DPO on TRL's trainers: generation (decoding, memory-bound), scoring, training.

    GRPO step seconds = train + generations per step x (generate + score + sync + vLLM sleep/wake)
    generations per optimizer step = gradient_accumulation_steps / steps_per_generation
    completion tokens/s = gpus x micro_batch x grad_accum x max_completion_length / step seconds

- **train**: the SFT step-time model (advisor.speed.throughput) of the step the ledger counts (advisor.memory.rl
  ``step_plan``: micro_batch completions of prompt + completion tokens, or DPO's 2 x micro_batch rows), with the
  fused head's loss term (TRL scores through its own fused head; advisor.speed.terms' fused-linear loss).
- **generate**: the serving side's decode roofline (advisor.speed.decode.decode_throughput: each decode step
  reads every weight byte and each sequence's cache, Pope et al. 2022 §2) for max_completion_length steps at the
  local generation batch, plus its prefill (2 FLOPs per weight per prompt token, Kaplan et al. 2020 §2.1). vLLM
  reads its weights in its format; transformers' ``generate()`` runs eagerly (each decode step dispatches every
  layer's ops: cpu_seconds_per_op x ops_per_layer, throughput.yaml) and a 4-bit bitsandbytes layer dequantizes its
  weight for any input of more than one row (bitsandbytes Linear4bit.forward: gemv_4bit only for a single token):
  0.5 B read, 2 B written and 2 B read again per weight per step.
- **score**: a no-grad forward of the generation batch per pass (old log-probs, reference): the forward's share of
  the training step's compute (forward 2 FLOPs per weight per token; backward 2 more for the inputs, 2 more for
  weight gradients of a full fine-tune: Kaplan et al. 2020 §2.1), without recomputation.
- **sync** (vLLM): the weights read and written once into vLLM (colocate: device memory; server: the host link
  broadcast, trl VLLMClient.update_named_param), and a PEFT policy's merge and unmerge (two passes over the adapted
  weights, peft merge_adapter).
- **vLLM sleep**: level 1 moves vLLM's weights to host memory and back every generation (2 x weights over the host
  link); level 2 drops them, and sync pushes them anyway (vLLM docs "Sleep Mode").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.plan import DPO, Plan, generation_steps
from advisor.memory.sharding import DEFAULT_SHARDING

RL_TERM_LABELS = {"generate": "generation (decoding)", "score": "scoring (no-grad log-prob passes)",
                  "sync": "weight sync into vLLM", "vllm_sleep": "vLLM sleep / wake",
                  "reference_forward": "reference forward (DPO)"}


@dataclass(frozen=True)
class RlTimes:
    """Seconds per optimizer step of each phase of a GRPO/DPO step (one GPU's view; data parallel GPUs run theirs at
    once)."""

    phases: dict[str, float]
    """train, generate, score, sync, vllm_sleep (GRPO); train, reference_forward (DPO)."""
    step_seconds: float
    completion_tokens_per_s: float
    """GRPO: completion tokens trained per second over every GPU; DPO: chosen and rejected tokens."""
    generations_per_step: float
    decode_step_seconds: float = 0.0
    """One decode step of the generation batch."""
    train_terms: dict[str, float] = field(default_factory=dict)

    @property
    def shares(self) -> dict[str, float]:
        total = max(self.step_seconds, 1e-12)
        return {k: v / total for k, v in self.phases.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shares"] = self.shares
        return d


def forward_share(plan: Plan) -> float:
    """The forward's share of a step's matmul work: 2 of 4 FLOPs per weight per token with frozen weights (no
    weight gradients), 2 of 6 for a full fine-tune (Kaplan et al. 2020 §2.1)."""
    return 1 / 3 if plan.method == "full" else 1 / 2


def micro_forward_seconds(plan: Plan, terms: dict[str, float]) -> float:
    """A no-grad forward of one micro-batch from the training step's terms (per optimizer step of grad_accum
    micro-batches): the forward's share of the matmuls, attention, elementwise work, LoRA and dequantization, and the
    forward's eager ops."""
    work = sum(terms.get(k, 0.0) for k in ("matmul", "attention", "elementwise", "lora", "dequant", "loss"))
    launch = terms.get("launch_overhead", 0.0) / (1 + 1.5)  # forward ops of forward + 1.5x backward (ops_per_layer)
    return (forward_share(plan) * work + launch) / plan.grad_accum


def decode_seconds(model: ModelSpec, plan: Plan, gpu: GpuSpec, seqs: int) -> tuple[float, float]:
    """(one decode step of ``seqs`` sequences, the prefill of their prompts) for the plan's generation engine."""
    from advisor.core.serve_priors import load_priors
    from advisor.memory.inference import ServePlan
    from advisor.speed.decode import decode_throughput
    from advisor.speed.inputs import constants

    S = plan.max_prompt_length + plan.max_completion_length
    vllm = plan.generation != "transformers"
    fmt = "int4" if plan.four_bit and vllm else "bf16"
    step = decode_throughput(model, ServePlan(weight_format=fmt, context_len=S, concurrency=max(1, seqs)), gpu)
    seconds = step.step_seconds
    tp = plan.vllm_gpus if plan.generation == "vllm-server" else 1
    if tp > 1:
        seconds /= tp  # tensor parallel: each GPU reads its shard of the weights and caches
    d = load_priors()["decode"]
    bw = gpu.mem_bw_gbs * 1e9 * d["bandwidth_efficiency"]
    if not vllm:
        k = constants()
        ops = model.num_layers * k["ops_per_layer"]["base"]
        if plan.four_bit:
            linear = sum(m.in_features * m.out_features for layer in model.description.layers for m in layer.linears)
            seconds += linear * (2 + 2) / bw  # dequantize_4bit writes the 16-bit weight, the matmul reads it
            ops += model.num_layers * 7 * k["ops_per_layer"]["quantized_linear"]
        seconds = max(seconds, ops * k["cpu_seconds_per_op"])  # eager decoding: the host dispatches every op
    flops = 2 * model.params_total * seqs * plan.max_prompt_length
    prefill = flops / ((gpu.bf16_tflops or gpu.fp16_tflops) * 1e12 * d["matmul_efficiency"]) / tp
    return seconds, prefill


def predict_rl(model: ModelSpec, plan: Plan, gpu: GpuSpec, tp, gpus: int = 1,
               sharding: str = DEFAULT_SHARDING) -> RlTimes:
    """Seconds per optimizer step of each phase of ``plan`` (GRPO or DPO) and its tokens/s. ``tp``: the SFT
    step-time model's prediction of the step the ledger counts (advisor.speed.throughput.rl_train_step)."""
    from advisor.memory.rl import old_logprobs_computed, reference_kind, vllm_weight_bytes
    from advisor.speed.inputs import constants

    train = tp.step_seconds
    micro = micro_forward_seconds(plan, tp.terms)
    if plan.task == DPO:
        ref = plan.grad_accum * micro if reference_kind(plan) != "precomputed" else 0.0
        step = train + ref
        tokens = gpus * plan.tokens_per_step  # chosen and rejected
        return RlTimes({"train": train, "reference_forward": ref}, step, tokens / step, 0.0, 0.0, dict(tp.terms))
    spg = generation_steps(plan)
    gens = plan.grad_accum / spg
    seqs = plan.micro_batch * spg
    dec, prefill = decode_seconds(model, plan, gpu, seqs)
    generate = plan.max_completion_length * dec + prefill
    passes = int(old_logprobs_computed(plan)) + int(reference_kind(plan) is not None)
    score = passes * spg * micro
    sync = sleep = 0.0
    if plan.generation != "transformers":
        weights = vllm_weight_bytes(model, plan)
        bw = gpu.mem_bw_gbs * 1e9
        k = constants()
        link = gpu.host_link_gbs * 1e9 * k["host_link_efficiency"]
        sync = 2 * weights / bw if plan.generation == "vllm-colocate" else weights / link
        if plan.peft:
            adapted = sum(m.in_features * m.out_features for layer in model.description.layers for m in layer.linears)
            sync += 2 * 2 * adapted * 4 / bw  # merge and unmerge: read and write each adapted weight (fp32 math)
        if plan.generation == "vllm-colocate" and plan.vllm_sleep == 1:
            sleep = 2 * weights / link  # offload to host at sleep, copy back at wake_up
        elif plan.generation == "vllm-colocate" and plan.vllm_sleep == 2:
            sleep = 2 * weights / bw  # dropped: the weights are pushed again, on top of the sync's own push
    phases = {"train": train, "generate": gens * generate, "score": gens * score, "sync": gens * sync,
              "vllm_sleep": gens * sleep}
    step = sum(phases.values())
    tokens = gpus * plan.tokens_per_step  # completion tokens
    return RlTimes(phases, step, tokens / step, gens, dec, dict(tp.terms))


def rl_terms(model: ModelSpec, plan: Plan, gpu: GpuSpec, tp, gpus: int = 1, sharding: str = DEFAULT_SHARDING
             ) -> tuple[dict[str, float], RlTimes]:
    """The step's terms (seconds per optimizer step): the training step's own (``tp``), and one per RL phase."""
    times = predict_rl(model, plan, gpu, tp, gpus, sharding)
    terms = dict(times.train_terms)
    terms.update({k: v for k, v in times.phases.items() if k != "train"})
    return terms, times


__all__ = ["RL_TERM_LABELS", "RlTimes", "predict_rl", "rl_terms"]
