"""GRPO and DPO on TRL's trainers (TRL 1.16): the memory of each phase of a step, in closed form.

A GRPO step (trl GRPOTrainer) has four phases, and what stays resident across them decides the run's peak:

1. **generate**: the local generation batch, ``micro_batch x steps_per_generation`` completions of at most
   ``max_prompt_length + max_completion_length`` tokens (GRPOConfig.__post_init__: generation_batch_size =
   per_device_train_batch_size x num_processes x steps_per_generation), sampled either by ``generate()`` on the
   policy (its KV cache) or by vLLM (its pool: ``gpu_memory_utilization`` x the GPU's total, holding the weights,
   non-torch memory, the profiled activation peak, CUDA graphs and, in the rest, the KV cache: vllm/v1/worker/
   gpu_worker.py ``determine_available_memory``);
2. **score**: no-grad forwards of ``micro_batch`` sequences at a time (``_get_per_token_logps_and_entropies``'s
   ``batch_size``) for the old log-probs (only when gradient_accumulation_steps % (steps_per_generation x
   num_iterations) != 0, or with vLLM and its importance-sampling correction, TRL's default) and the reference's
   (beta > 0): TRL's fused LM head scores the completion tokens in tiles, never the full logits
   (trl/trainer/utils.py ``add_fused_lm_head``, trl/kernels/chunked_logprob.py);
3. **train**: the training step over ``micro_batch`` completions of prompt + completion tokens, log-probs of the
   completion tokens only (``logits_to_keep``), through the same fused head; the SFT ledger (advisor.memory.training)
   counts everything else;
4. **sync** (vLLM only): the weights pushed into vLLM after each optimizer step; a PEFT policy is merged first
   (``merge_adapter``: one layer's merge at a time), then unmerged (trl/generation/vllm_generation.py
   ``_iter_named_params``).

DPO (trl DPOTrainer) runs chosen and rejected concatenated, ``2 x micro_batch`` sequences of ``seq_len``
(DPOConfig.max_length) tokens, through the policy with grad, then through the reference without grad while the
policy's saved activations are still alive (``_compute_loss``), unless the reference log-probs were precomputed
(a phase of its own before training, ``_precompute_ref_logps``).

Residency: vLLM's pool stays through scoring and training unless it sleeps (level 1: weights to host memory, KV
cache discarded; level 2: both discarded; vLLM docs "Sleep Mode"; TRL's ``vllm_enable_sleep_mode`` uses level 2); a
frozen reference copy stays all run (TRL loads it beside the policy); the disabled adapter costs nothing; precomputed
log-probs cost a column of the dataset. The ledger names each part: ``reference_weights``, ``vllm_weights``,
``kv_cache``, ``vllm_reserve`` (vLLM's activations, CUDA graphs and non-torch memory), ``rollout`` (the generation
batch's ids, masks and log-probs), beside the SFT categories.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from advisor.core.catalog import MIB, GpuSpec, ModelSpec
from advisor.core.plan import DPO, DTYPE_BYTES, GRPO, RL_TASKS, Plan, uses_reference, generation_steps
from advisor.memory.ledger import MemoryReport, PhaseMemory, RunPhases
from advisor.memory.rl_head import (TOKEN_TILE, VOCAB_TILE, forward_rows, fused_head_bytes, head_bytes,  # noqa: F401
                                    is_rl, scored_tokens, sequence_tokens, step_plan)

RL_CATEGORIES = ("reference_weights", "vllm_weights", "kv_cache", "vllm_reserve", "rollout")
"""Device categories a GRPO/DPO step adds to the SFT ledger's (advisor.memory.ledger.CATEGORIES)."""
GRPO_PHASES = ("load", "generate", "score", "train", "sync", "save")
DPO_PHASES = ("load", "precompute", "train", "save")

TRL_VLLM_BATCHED_TOKENS = 4096
"""max_num_batched_tokens TRL gives a colocated vLLM (trl/generation/vllm_generation.py: "Latest vLLM v1 memory
profiler is misled by the high default value")."""
SERVER_UTILIZATION = 0.9
"""trl vllm-serve's --gpu-memory-utilization default (trl/scripts/vllm_serve.py ScriptArguments)."""
SERVER_MAX_SEQS = 256
"""vLLM's max_num_seqs default for a server (vllm/engine/arg_utils.py EngineArgs.get_batch_defaults)."""
VLLM_NON_TORCH_MIB = 256
"""A prior: the non-torch memory vLLM's profiling finds beyond the process's own (cuBLAS/cuDNN and attention
backend workspaces, NCCL buffers; vLLM logs it as "non-torch memory" in gpu_worker.determine_available_memory);
the CUDA context itself is the trainer's, counted once, in its overhead."""
BLOCK = 16
"""vLLM's KV block size (tokens), as the serving ledger uses it (advisor.memory.inference.ServePlan.block_size)."""


def no_grad_forward(model: ModelSpec, plan: Plan, rows: int, seq: int, tokens: int) -> tuple[int, str]:
    """Peak transient of one no-grad scoring forward of ``rows x seq`` tokens with ``tokens`` scored positions: the
    widest layer (advisor.memory.phases.forward_transient, without logits) or the fused head's forward."""
    from advisor.memory.phases import forward_transient

    mlp, where = forward_transient(model, plan, rows, seq, full_logits=False)
    head, _ = fused_head_bytes(model, plan, tokens, grad=False)
    return (int(mlp), where) if mlp >= head else (int(head), "the fused log-prob head")


# ----------------------------------------------------------------------------------------------- the reference


def reference_kind(plan: Plan) -> str | None:
    """adapter, copy, precomputed, or None (GRPO with beta 0: TRL loads no reference)."""
    return plan.reference if uses_reference(vars(plan)) else None


def reference_weight_bytes(model: ModelSpec, plan: Plan) -> int:
    """A frozen copy of the base in the policy's format: TRL builds it from the same model_init_kwargs (dtype and
    quantization_config: GRPOTrainer/DPOTrainer ``create_model_from_path``); its constants included."""
    if reference_kind(plan) != "copy":
        return 0
    from advisor.memory.training import param_breakdown, weight_bytes

    base = plan.with_(method="full" if not plan.peft else plan.method)
    weights, consts = weight_bytes(model, base, param_breakdown(model, base))
    if plan.method == "full":
        # a full fine-tune's reference is the model in its parameter dtype, every weight frozen
        weights = model.params_total * DTYPE_BYTES[plan.param_dtype]
    return int(weights + consts)


# ----------------------------------------------------------------------------------------------- generation


@dataclass(frozen=True)
class Generation:
    """How GRPO's completions are generated and what that holds (the ``generation`` object of the estimate)."""

    engine: str
    """transformers, vllm-colocate or vllm-server."""
    sequences: int
    """Completions generated per device at once: micro_batch x steps_per_generation (the local generation batch)."""
    sequence_tokens: int
    """prompt + completion tokens of each."""
    pool_bytes: int
    """vLLM: gpu_memory_utilization x the GPU's total (on a server GPU for vllm-server); transformers: the KV
    cache and the generation's transient on the training GPU."""
    weights_bytes: int
    """vLLM's own copy of the weights, in its format (0: generate() uses the policy's)."""
    kv_cache_bytes: int
    kv_tokens: int
    """Tokens the KV cache holds at once (whole blocks for vLLM)."""
    kv_bytes_per_token: int
    activation_bytes: int = 0
    """vLLM: the profiled activation peak of a forward of max_num_batched_tokens tokens."""
    cuda_graph_bytes: int = 0
    non_torch_bytes: int = 0
    transient_bytes: int = 0
    """transformers: the prefill / sampling transient beside the cache."""
    max_model_len: int = 0
    max_num_seqs: int = 0
    gpus: int = 1
    """GPUs the engine runs on (vllm-server: --vllm-gpus, tensor parallel; else the training GPU)."""
    batch_tokens: int = 0
    """KV tokens one generation batch needs: sequences x (prompt + completion), in whole blocks for vLLM."""
    holds_batch: bool = True
    """The KV cache holds the whole generation batch; False: vLLM preempts sequences (recomputes them later)."""
    starts: bool = True
    """vLLM can start: its KV cache is positive and holds one sequence of max_model_len."""
    notes: tuple[str, ...] = ()

    @property
    def reserve_bytes(self) -> int:
        """What vLLM keeps beside weights and KV cache: activations, CUDA graphs, non-torch memory."""
        return self.activation_bytes + self.cuda_graph_bytes + self.non_torch_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["reserve_bytes"] = self.reserve_bytes
        return d


def kv_dtype_bytes(plan: Plan) -> int:
    """Bytes per KV element: the compute dtype (fp32 plans cache in fp32)."""
    return DTYPE_BYTES[plan.activation_dtype]


def kv_per_token(model: ModelSpec, plan: Plan) -> int:
    """Cache growth per token over every layer (advisor.memory.inference.kv_cache_bytes_per_token), in the plan's
    compute dtype."""
    from advisor.memory.inference import kv_cache_bytes_per_token

    return int(kv_cache_bytes_per_token(model, "bf16") * kv_dtype_bytes(plan) / 2)


def vllm_weight_bytes(model: ModelSpec, plan: Plan) -> int:
    """vLLM's weights: 16-bit as the checkpoint ships them, or bitsandbytes 4-bit for a QLoRA policy (TRL passes
    quantization="bitsandbytes" when the model holds Linear4bit layers: vllm_generation.py), in-flight quantized:
    0.5 B per decoder-linear weight plus an fp32 absmax per 64 (bitsandbytes blocksize), the rest 16-bit."""
    from advisor.memory.inference import serve_weight_bytes, _linear_weights

    if plan.four_bit:
        linear, _ = _linear_weights(model)
        return int(linear * 0.5 + linear / 64 * 4 + (model.params_total - linear) * 2)
    return int(sum(serve_weight_bytes(model, "bf16")))


def generation_of(model: ModelSpec, plan: Plan, gpu: GpuSpec | None) -> Generation | None:
    """The generation engine's memory for a GRPO plan (None for another task)."""
    if plan.task != GRPO:
        return None
    seqs = plan.micro_batch * generation_steps(plan)
    S = sequence_tokens(plan)
    if plan.generation == "transformers":
        return _generate_transformers(model, plan, seqs, S)
    return _vllm(model, plan, gpu, seqs, S)


def _generate_transformers(model: ModelSpec, plan: Plan, seqs: int, S: int) -> Generation:
    """generate() on the policy (TRL ``_generate_single_turn``: the whole local generation batch at once, no grad,
    checkpointing off): a DynamicCache of seqs x S tokens at the last step, which grows by torch.cat (a layer's
    K and V copied once per step: one layer's cache beside it); prefill of seqs x prompt tokens; sampling holds the
    fp32 logits of the last position and their softmax (transformers GenerationMixin._sample: logits.float(),
    softmax, multinomial)."""
    from advisor.memory.phases import forward_transient

    per_token = kv_per_token(model, plan)
    kv = per_token * seqs * S
    layer_copy = kv // max(1, model.num_layers)
    prefill, _ = forward_transient(model, plan, seqs, plan.max_prompt_length, full_logits=False)
    sampling = 3 * seqs * model.vocab_size * 4
    decode, _ = forward_transient(model, plan, seqs, 1, full_logits=False)
    prefill_peak = per_token * seqs * plan.max_prompt_length + prefill
    decode_peak = kv + layer_copy + max(decode, sampling)
    transient = max(prefill_peak, decode_peak) - kv
    notes = (f"generate(): {seqs} completions at once (micro-batch {plan.micro_batch} x {generation_steps(plan)} "
             f"step(s) per generation), a KV cache of {seqs} x {S:,} tokens at the last token",)
    return Generation("transformers", seqs, S, pool_bytes=int(kv + transient), weights_bytes=0, kv_cache_bytes=int(kv),
                      kv_tokens=seqs * S, kv_bytes_per_token=per_token, transient_bytes=int(transient),
                      max_num_seqs=seqs, batch_tokens=seqs * S, notes=notes)


def _vllm(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, seqs: int, S: int) -> Generation:
    """vLLM's pool, as vLLM accounts it (vllm/v1/worker/gpu_worker.py determine_available_memory: requested =
    gpu_memory_utilization x total; KV cache = requested - weights - peak activations - non-torch - CUDA graphs),
    with the serving ledger's terms (advisor.memory.inference: vllm_activations, cuda_graph_reserve)."""
    from advisor.memory.inference import ServePlan, cuda_graph_reserve, vllm_activations

    colocate = plan.generation == "vllm-colocate"
    tp = 1 if colocate else plan.vllm_gpus
    util = plan.vllm_gpu_memory_utilization if colocate else SERVER_UTILIZATION
    # TRL: max_num_seqs = per_device_train_batch_size x vllm_tensor_parallel_size x steps_per_generation
    max_seqs = seqs if colocate else SERVER_MAX_SEQS
    batched = TRL_VLLM_BATCHED_TOKENS if colocate else max(2048, max_seqs)
    total = gpu.memory_bytes if gpu is not None else 0
    pool = int(util * total)
    weights = vllm_weight_bytes(model, plan) // tp
    sp = ServePlan(context_len=S, concurrency=max_seqs, max_num_batched_tokens=batched)
    act = vllm_activations(model, sp)
    graphs = cuda_graph_reserve(model, sp)
    non_torch = VLLM_NON_TORCH_MIB * MIB
    per_token = kv_per_token(model, plan) // tp
    kv = max(0, pool - weights - act - graphs - non_torch)
    tokens = kv // (per_token * BLOCK) * BLOCK if per_token else 0
    blocks_per_seq = -(-S // BLOCK)
    need = seqs * blocks_per_seq * BLOCK
    notes: list[str] = []
    where = "the training GPU" if colocate else f"each of the {tp} server GPU(s)"
    if gpu is None:
        notes.append("no GPU named: vLLM's pool (gpu_memory_utilization x the card's memory) is unknown")
    starts = kv > 0 and tokens >= blocks_per_seq * BLOCK
    if not starts:
        notes.append(f"vLLM cannot start: its pool of {util:g} x the card leaves {_gib(kv)} for the KV cache on "
                     f"{where}, less than one sequence of {S:,} tokens: raise --vllm-gpu-memory-utilization or "
                     "shorten the lengths")
    held = trainer_at_vllm_start(model, plan, gpu) if colocate and gpu is not None else 0
    if held and held + pool > total:
        # vLLM refuses a pool larger than the free memory at its start (vllm/v1/worker/gpu_worker.py init_device:
        # "Free memory on device ... is less than desired GPU memory utilization")
        starts = False
        notes.append(f"vLLM cannot start: the trainer holds {_gib(held)} when GRPOTrainer starts vLLM, and its pool of "
                     f"{_gib(pool)} needs more than the {_gib(max(0, total - held))} left free: lower "
                     "--vllm-gpu-memory-utilization")
    holds = tokens >= need
    if starts and not holds:
        notes.append(f"vLLM's KV cache holds {tokens:,} tokens, fewer than the generation batch's {need:,} "
                     f"({seqs} x {S:,}): it runs what fits and preempts the rest (recomputed later: slower)")
    notes.append(f"vLLM's max_model_len is taken as prompt + completion ({S:,}; GRPOConfig.vllm_max_model_length): "
                 f"TRL's default, the model's context ({model.max_position_embeddings or 0:,}), needs "
                 f"{_gib(per_token * (model.max_position_embeddings or 0))} of KV cache for one sequence or vLLM "
                 "refuses to start")
    return Generation(plan.generation, seqs, S, pool_bytes=pool, weights_bytes=int(weights), kv_cache_bytes=int(kv),
                      kv_tokens=int(tokens), kv_bytes_per_token=int(per_token), activation_bytes=int(act),
                      cuda_graph_bytes=int(graphs), non_torch_bytes=int(non_torch), max_model_len=S,
                      max_num_seqs=max_seqs, gpus=tp, batch_tokens=need, holds_batch=holds, starts=starts,
                      notes=tuple(notes))


def trainer_at_vllm_start(model: ModelSpec, plan: Plan, gpu: GpuSpec | None) -> int:
    """What the training process holds when GRPOTrainer.__init__ starts a colocated vLLM: the policy's weights,
    constants and adapters and the reference copy (loaded before it), no optimizer state yet, and the CUDA context."""
    from advisor.memory.overhead import outside_allocator_bytes
    from advisor.memory.training import param_breakdown, weight_bytes

    pb = param_breakdown(model, plan)
    adapters = pb.adapter * 4 if plan.peft else 0
    return int(sum(weight_bytes(model, plan, pb)) + adapters + reference_weight_bytes(model, plan)
               + outside_allocator_bytes(gpu))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# ----------------------------------------------------------------------------------------------- residency


def rollout_bytes(model: ModelSpec, plan: Plan) -> int:
    """The generation batch the trainer keeps from generation to its last micro-batch (GRPO): prompt_completion_ids
    and attention_mask (int64), completion_mask (int64), and fp32 old, reference and sampling log-probs, advantages
    (GRPOTrainer._generate_and_score_completions' output dict)."""
    if plan.task != GRPO:
        return 0
    seqs = plan.micro_batch * generation_steps(plan)
    S, C = sequence_tokens(plan), plan.max_completion_length
    return int(seqs * (3 * 8 * S + 3 * 4 * C + 4))


def vllm_during_training(gen: Generation | None, plan: Plan) -> dict[str, int]:
    """What a colocated vLLM holds on the training GPU while the trainer scores and trains: the whole pool awake
    (its activation reserve is the process's caching allocator's, which the trainer reuses: not held); at sleep
    level 1 or 2 only CUDA graphs and non-torch memory (vLLM docs "Sleep Mode": level 1 offloads the weights to
    CPU memory and discards the KV cache, level 2 discards both)."""
    if gen is None or plan.generation != "vllm-colocate":
        return {}
    held = {"vllm_reserve": gen.cuda_graph_bytes + gen.non_torch_bytes}
    if plan.vllm_sleep == 0:
        held.update(vllm_weights=gen.weights_bytes, kv_cache=gen.kv_cache_bytes)
    return held


def vllm_host_bytes(gen: Generation | None, plan: Plan) -> int:
    """Host memory of a sleeping vLLM: its weights at level 1 (pinned CPU copy), nothing at level 2."""
    if gen is None or plan.generation != "vllm-colocate" or plan.vllm_sleep != 1:
        return 0
    return gen.weights_bytes


def resident_extras(model: ModelSpec, plan: Plan, gpu: GpuSpec | None) -> dict[str, int]:
    """The GRPO/DPO categories on the training GPU during the training step."""
    gen = generation_of(model, plan, gpu)
    out = {"reference_weights": reference_weight_bytes(model, plan), "rollout": rollout_bytes(model, plan)}
    out.update(vllm_during_training(gen, plan))
    return {k: int(v) for k, v in out.items() if v}


def old_logprobs_computed(plan: Plan) -> bool:
    """TRL computes the policy's old log-probs when a generation batch outlives one optimizer step or with vLLM
    (vllm_importance_sampling_correction, on by default): GRPOTrainer._generate_and_score_completions."""
    return plan.grad_accum % generation_steps(plan) != 0 or plan.generation != "transformers"


# ----------------------------------------------------------------------------------------------- the step


def step_ledger(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None) -> MemoryReport:
    """The closed-form ledger of one training step of any task: GRPO / DPO here (``estimate_rl_step``), supervised
    fine-tuning by advisor.memory.training."""
    from advisor.memory.training import estimate_training

    return estimate_rl_step(model, plan, gpu) if is_rl(plan) else estimate_training(model, plan, gpu)


def estimate_rl_step(model: ModelSpec, plan: Plan, gpu: GpuSpec | None) -> MemoryReport:
    """The training step of a GRPO/DPO plan: the SFT ledger of its rows at its sequence length with TRL's fused
    head (advisor.memory.training), DPO's reference forward inside the step, and what stays resident from the
    other phases (reference copy, vLLM, the generation batch)."""
    from advisor.memory import training

    plan.validate()
    inner = step_plan(plan)
    head = head_bytes(model, plan)
    ref_forward = _dpo_reference_forward(model, plan)
    report = training.estimate_step(model, inner, gpu, head=head, reference_forward=ref_forward)
    extras = resident_extras(model, plan, gpu)
    device = dict(report.device)
    for k, v in extras.items():
        device[k] = device.get(k, 0) + v
    added = sum(extras.values())
    gen = generation_of(model, plan, gpu)
    host = dict(report.host)
    hm = report.host_memory
    on_host = vllm_host_bytes(gen, plan)
    if on_host:
        host["vllm_weights"] = on_host
        if hm is not None:
            hm = replace(hm, pinned={**hm.pinned, "vllm_weights": on_host},
                         notes=(*hm.notes, "vLLM asleep at level 1: its weights in pinned host memory"))
    notes = list(report.notes) + step_notes(model, plan, gen)
    extra = {**report.extra, "task": plan.task, "rows_per_forward": forward_rows(plan),
             "sequence_tokens": sequence_tokens(plan), "scored_tokens": scored_tokens(plan),
             "reference": reference_kind(plan), "rl_resident": extras,
             "generation": gen.to_dict() if gen is not None else None}
    return replace(report, device=device, host=host, host_memory=hm,
                   tensor_peak_bytes=int(report.tensor_peak_bytes + added), peak_bytes=int(report.peak_bytes + added),
                   reserved_peak_bytes=(int(report.reserved_peak_bytes + added)
                                        if report.reserved_peak_bytes is not None else None),
                   notes=tuple(notes), extra=extra)


def _dpo_reference_forward(model: ModelSpec, plan: Plan) -> int:
    """DPO's reference forward inside the step (DPOTrainer._compute_loss: after the policy's forward, before its
    backward, without grad and with checkpointing off): the widest layer or the fused head of 2 x micro_batch rows;
    0 when the reference log-probs were precomputed."""
    if plan.task != DPO or reference_kind(plan) == "precomputed":
        return 0
    return no_grad_forward(model, plan, forward_rows(plan), plan.seq_len, scored_tokens(plan))[0]


def step_notes(model: ModelSpec, plan: Plan, gen: Generation | None) -> list[str]:
    notes = []
    if plan.task == GRPO:
        notes.append(f"GRPO step: {plan.micro_batch} completions of {sequence_tokens(plan):,} tokens per forward "
                     f"(--micro-batch counts completions, TRL's per_device_train_batch_size); log-probs of the "
                     f"{plan.max_completion_length:,} completion tokens through TRL's fused head, no full logits")
    else:
        notes.append(f"DPO step: chosen and rejected concatenated, {forward_rows(plan)} rows of {plan.seq_len:,} "
                     "tokens (--seq-len is DPOConfig.max_length of each)")
        if plan.padding_free:
            notes.append("padding_free: TRL 1.16's DPOTrainer warns that padding-free is disabled and pads instead; at "
                         "the longest rows (what the ledger sizes) padding and padding-free hold the same tokens")
    if plan.loss != "plain":
        notes.append(f"--loss {plan.loss} is SFT's: TRL 1.16's GRPOTrainer and DPOTrainer always score through their "
                     "own fused log-prob head (add_fused_lm_head; use_liger_kernel applies Liger's layer kernels only)")
    kind = reference_kind(plan)
    if kind == "adapter":
        notes.append("reference: the policy with its adapter disabled (peft disable_adapter): no second copy")
    elif kind == "copy":
        notes.append(f"reference: a frozen copy of the base, {_gib(reference_weight_bytes(model, plan))}, resident "
                     "all run")
    elif kind == "precomputed":
        notes.append("reference: log-probs precomputed before training (precompute_ref_log_probs): no reference "
                     "during the step")
    elif plan.task == GRPO:
        notes.append("beta 0: TRL loads no reference model")
    if gen is not None and plan.generation == "vllm-colocate":
        state = {0: "awake: its weights and KV cache stay during scoring and training",
                 1: "asleep at level 1 during scoring and training: weights in host memory, KV cache discarded",
                 2: "asleep at level 2 during scoring and training: weights and KV cache discarded, pushed again "
                    "at each sync"}[plan.vllm_sleep]
        notes.append(f"vLLM colocated, {state}")
    return notes


# ----------------------------------------------------------------------------------------------- the phases


def rl_run_phases(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, step: MemoryReport, *,
                  load: tuple | None = None, source: str | None = None) -> RunPhases:
    """The phases of a GRPO or DPO run from its training-step report (any backend's): the load and save as an
    SFT run's (advisor.memory.phases), train as the backend measured it, and the task's own phases in closed form.
    A step that lacks a resident category (a simulated trainer step without vLLM) gets it added to its train phase."""
    from advisor.memory.overhead import outside_allocator_bytes
    from advisor.memory.phases import reserved_for, resident_bytes, run_phases

    base = run_phases(model, plan, gpu, step, load=load, source=source, evaluates=False)
    outside = outside_allocator_bytes(gpu)
    extras = resident_extras(model, plan, gpu)
    missing = {k: v for k, v in extras.items() if k not in step.device}
    frac = (step.reserved_peak_bytes / step.tensor_peak_bytes - 1
            if step.reserved_peak_bytes and step.tensor_peak_bytes else None)
    trainer = resident_bytes(step) + step.device.get("reference_weights", 0) + extras.get("reference_weights", 0) * (
        "reference_weights" in missing)
    phases: dict[str, PhaseMemory] = {"load": base.phases["load"]}
    notes = list(base.notes)

    def phase(name: str, live: int, what: str, notes_: tuple[str, ...] = (), included: bool = True):
        reserved, _ = reserved_for(int(live), gpu, plan=plan, fragmentation=frac)
        phases[name] = PhaseMemory(name, int(live), int(reserved), int(reserved + outside), "estimated", what,
                                   included, notes_)

    train = base.phases["train"]
    train = replace(train, what=train.what.replace(f"seq {plan.seq_len:,}", f"{forward_rows(plan)} x "
                                                   f"{sequence_tokens(plan):,} tokens", 1))
    if missing:
        add = sum(missing.values())
        train = replace(train, live_bytes=train.live_bytes + add, reserved_bytes=train.reserved_bytes + add,
                        peak_bytes=train.peak_bytes + add,
                        notes=(*train.notes, "with " + ", ".join(missing) + " resident beside the trainer's step"))
    rows, S = forward_rows(plan), sequence_tokens(plan)
    gathered = gathered_for_generation(model, plan, step)
    if plan.task == GRPO:
        gen = generation_of(model, plan, gpu)
        rollout = extras.get("rollout", 0)
        colocated = plan.generation == "vllm-colocate"
        if plan.generation == "transformers":
            phase("generate", trainer + rollout + gen.pool_bytes + gathered,
                  f"generate(): KV cache {gen.sequences} x {S:,} tokens" + (", every weight gathered" if gathered
                                                                           else ""), gen.notes)
        else:
            # awake for generation: the whole pool on the training GPU when colocated
            on_gpu = gen.pool_bytes if colocated else 0
            what = (f"vLLM pool {plan.vllm_gpu_memory_utilization:g} x the card (KV {gen.kv_tokens:,} tokens)"
                    if colocated else f"vLLM on {gen.gpus} server GPU(s); the trainer waits")
            phase("generate", trainer + rollout + on_gpu, what, gen.notes)
        during = sum(vllm_during_training(gen, plan).values())
        score_t, where = no_grad_forward(model, plan, rows, S, scored_tokens(plan))
        passes = [w for w, on in (("old log-probs", old_logprobs_computed(plan)),
                                  ("reference", reference_kind(plan) is not None)) if on]
        phase("score", trainer + rollout + during + score_t,
              ("no-grad forward of " + " and ".join(passes) + f", {rows} x {S:,}: {where}") if passes
              else "no scoring pass (on-policy without a reference: TRL skips both)",
              included=bool(passes))
        phases["train"] = train
        if plan.generation == "transformers":
            phase("sync", trainer, "no weight sync: generate() uses the policy itself", included=False)
        else:
            sync_t, what = sync_transient(model, plan)
            if plan.peft:
                sync_t += gathered  # PEFT under ZeRO-3 gathers the whole model before merging (_iter_named_params)
            held = gen.weights_bytes + (gen.kv_cache_bytes if plan.vllm_sleep == 0 else 0) + gen.reserve_bytes \
                if colocated else 0
            phase("sync", trainer + held + sync_t, what)
    else:
        pre = reference_kind(plan) == "precomputed"
        t, where = no_grad_forward(model, plan, rows, plan.seq_len, scored_tokens(plan))
        # before training, the policy itself (its adapter disabled for PEFT) scores the dataset: with
        # precompute_ref_log_probs TRL loads no reference (DPOTrainer.__init__: ref_model None unless FSDP;
        # _precompute_ref_logps uses ``self.ref_model or self.model``); no optimizer state yet
        weights = step.device.get("weights", 0) + step.device.get("quant_constants", 0) + \
            step.device.get("adapter_weights", 0)
        phase("precompute", weights + t, f"reference log-probs, {rows} x {plan.seq_len:,}: {where}", included=pre)
        phases["train"] = train
    phases["save"] = base.phases["save"]
    order = GRPO_PHASES if plan.task == GRPO else DPO_PHASES
    from advisor.memory.phases import cached_across

    return RunPhases(cached_across({n: phases[n] for n in order}, order), base.reserved_model, tuple(notes))


def gathered_for_generation(model: ModelSpec, plan: Plan, step: MemoryReport) -> int:
    """Weights a sharded (ZeRO-3 / FSDP) GRPO run gathers whole on each GPU beyond its shard: for generate()
    (GRPOConfig.ds3_gather_for_generation, on by default: unwrap_model_for_generation gathers every parameter; FSDP
    summon_full_params) and for a PEFT policy's merge before a vLLM sync (gather_params of every parameter)."""
    from advisor.memory.sharding import SHARDS_PARAMETERS
    from advisor.memory.training import param_breakdown, weight_bytes

    gpus, strategy = step.sharded or (1, "ddp")
    if plan.task != GRPO or gpus == 1 or strategy not in SHARDS_PARAMETERS:
        return 0
    if plan.generation != "transformers" and not plan.peft:
        return 0
    full = sum(weight_bytes(model, plan, param_breakdown(model, plan)))
    return int(max(0, full - step.device.get("weights", 0) - step.device.get("quant_constants", 0)))


def sync_transient(model: ModelSpec, plan: Plan) -> tuple[int, str]:
    """The weight sync's transient: a PEFT policy merges each adapted layer in place before its weights are read
    (peft merge_adapter; trl vllm_generation._iter_named_params): a 16-bit base adds the fp32 delta B A x scale
    (peft LoraLayer.get_delta_weight); a 4-bit base dequantizes, adds in fp32 and quantizes again
    (peft bnb.Linear4bit.merge: dequantize_bnb_weight, .to(lora dtype) + delta). A full fine-tune's weights are read
    as they are."""
    if not plan.peft:
        return 0, "weights pushed to vLLM one tensor at a time"
    shapes = model.linear_shapes()
    n = max(a * b for a, b in shapes.values())
    p = DTYPE_BYTES[plan.activation_dtype]
    per = p + 4 + 4 + 4 if plan.four_bit else 4
    return int(n * per), "merge_adapter: the largest layer's merge, then weights pushed to vLLM"


def is_rl_report(report: MemoryReport) -> bool:
    return report.extra.get("task") in RL_TASKS


__all__ = ["DPO_PHASES", "GRPO_PHASES", "Generation", "RL_CATEGORIES", "estimate_rl_step", "fused_head_bytes",
           "generation_of", "head_bytes", "is_rl", "rl_run_phases", "resident_extras", "step_plan"]
