"""The phases of a whole fine-tuning run, each with its own peak: load, train, eval, generate, save.

A run dies at more moments than its steady training step: loading quantizes tensor by
tensor, the longest batch sets the step's peak, evaluation runs a no-grad forward at its own batch
size with the whole vocabulary's logits, generation-based evaluation holds a KV cache, and saving a
ZeRO-3 model gathers its 16-bit weights. Each phase here has three figures at its peak:

- ``live_bytes``: tensors alive (``torch.cuda.max_memory_allocated``);
- ``reserved_bytes``: the caching allocator's segments (``torch.cuda.max_memory_reserved``);
- ``peak_bytes``: reserved plus what lives outside the allocator (CUDA context, cuBLAS workspace),
  what the GPU must hold (NVML / nvidia-smi).

Between phases the GPU keeps the *resident* state: weights, quantization constants, adapters,
optimizer states and fp32 masters. Gradients are gone: ``Trainer`` calls
``model.zero_grad(set_to_none=True)`` after every optimizer step (transformers trainer.py
``_inner_training_loop``), and evaluation and saving happen after it.

Calculation only: the ``PhaseMemory`` and ``RunPhases`` types live with the ``MemoryReport`` that carries
them (advisor.memory.ledger); ``advisor.ui.render.phase_table`` renders them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.adapters import attention_linears
from advisor.core.plan import DTYPE_BYTES, Plan, lora_target_modules
from advisor.memory.ledger import MemoryReport, PhaseMemory, RunPhases
from advisor.memory.sharding import SHARDS_PARAMETERS

PHASES = ("load", "train", "eval", "generate", "save")
RESIDENT = ("weights", "quant_constants", "adapter_weights", "optimizer_states", "master_weights")


# ----------------------------------------------------------------------------- the allocator's view


def reserved_for(live_peak: int, gpu: GpuSpec | None, events: Sequence[tuple[int, int]] | None = None, *,
                 plan: Plan | None = None, fragmentation: float | None = None) -> tuple[int, str]:
    """Reserved bytes at a phase's peak, and how they were obtained.

    With ``events`` (uid, +bytes for an allocation / -bytes for a free, in order) the sequence is replayed
    through the caching-allocator model (advisor.memory.allocator). Otherwise reserved
    = live x (1 + ``fragmentation``): the replayed step's fraction when the caller has one, else the
    fragmentation term of advisor/data/overheads.yaml (the interim guess).
    """
    expandable = plan is not None and plan.expandable_segments
    if events:
        from advisor.memory.allocator import AllocatorConfig, replay

        seq = [("alloc", uid, n) if n > 0 else ("free", uid, 0) for uid, n in events]
        return (int(replay(seq, AllocatorConfig(expandable_segments=expandable)).reserved_peak_bytes),
                "replayed through the caching-allocator model")
    if fragmentation is not None:
        return (int(live_peak * (1 + fragmentation)),
                f"allocated x {1 + fragmentation:.3f}, the step's reserved/allocated")
    from advisor.memory.overhead import overhead_terms

    key = "fragmentation_expandable" if expandable else "fragmentation"
    frac = float(overhead_terms(gpu)[key])
    return int(live_peak * (1 + frac)), f"interim: allocated x (1 + {frac:g}) (overheads.yaml {key})"


# ----------------------------------------------------------------------------- phases


def resident_bytes(report: MemoryReport) -> int:
    """What the GPU keeps between steps: weights, constants, adapters, optimizer states, fp32 masters."""
    return int(sum(report.device.get(c, 0) for c in RESIDENT))


def eval_batch(plan: Plan) -> int:
    return plan.eval_batch or plan.micro_batch


def max_new_tokens(plan: Plan) -> int:
    return plan.max_new_tokens


def forward_transient(model: ModelSpec, plan: Plan, batch: int, seq: int, *, full_logits: bool) -> tuple[int, str]:
    """Peak short-lived bytes of one no-grad forward of ``batch x seq`` tokens, and where it is.

    Inside the MLP: the residual stream, attention output, normed input and residual sum (4 T h), gate,
    act(gate) and up (3 T i) and rotary cos/sin (advisor.memory.inference.hf_transient, transformers
    ``DecoderLayer.forward``); a 4/8-bit layer's dequantized weight during its matmul (bitsandbytes
    ``dequantize_4bit``); peft's fp32 cast of a LoRA input (peft/tuners/lora/layer.py ``Linear.forward``).
    At the head: the final hidden states and the logits. With labels (evaluation) the model computes its
    loss over every position: bf16 logits, their fp32 copy and log_softmax's fp32 output
    (transformers loss_utils.ForCausalLMLoss ``logits.float()``, ``F.cross_entropy``); generation keeps the
    last position only (``logits_to_keep=1``) as fp32.
    """
    p = DTYPE_BYTES[plan.activation_dtype]
    T = batch * seq
    h, i = model.hidden_size, model.intermediate_size
    shapes = model.linear_shapes()
    dequant = max(a * b for a, b in shapes.values()) * p if plan.quantized else 0
    targets = (lora_target_modules(plan, list(shapes), attention_linears(model))
               if plan.peft and not model.is_moe else [])
    lora_cast = 4 * T * max((shapes[m][0] for m in targets), default=0)
    if model.is_moe:
        # routed experts: tokens x top-k rows (advisor.memory.experts); LoRA on the attention and what peft leaves
        from advisor.core.adapters import adapted_modules
        from advisor.memory.experts import mlp_forward_bytes

        targets = adapted_modules(model, plan) if plan.peft else []
        lora_cast = 4 * T * max((shapes[m][0] for m in targets), default=0)
        mlp = p * (4 * T * h + 2 * seq * model.head_dim) + mlp_forward_bytes(model, plan, T) + max(dequant, lora_cast)
    else:
        mlp = p * (4 * T * h + 3 * T * i + 2 * seq * model.head_dim) + max(dequant, lora_cast)
    up = 4 if p < 4 else 0  # .float() of fp32 logits returns them as they are
    if full_logits:
        head = p * T * h + (p + up + 4) * T * model.vocab_size
    else:
        head = p * T * h + (p + up) * batch * model.vocab_size
    return (int(mlp), "MLP of a layer") if mlp >= head else (int(head), "logits and loss" if full_logits else "logits")


def load_estimate(model: ModelSpec, plan: Plan) -> tuple[int, int, str]:
    """(live peak, live at the end, what) of ``from_pretrained`` by closed form, tensor by tensor.

    The same walk as the simulation (advisor.runtime.simulate.load): quantized tensors arrive in the
    load dtype and are quantized on the GPU, so the largest transient is the biggest quantized tensor in
    16 bits next to everything loaded so far (transformers core_model_loading loads synchronously under
    on-the-fly quantization); unquantized tensors arrive as they stay. The last layer's MLP weight is the
    last large tensor loaded (``dot_natural_key`` order), so the peak is the loaded model plus that
    tensor's 16-bit copy. ZeRO plans follow DeepSpeed (see ``load_offload``).
    """
    from advisor.memory import vision
    from advisor.memory.training import NF4_BLOCK, param_breakdown, weight_bytes

    if plan.offload != "none":
        return load_offload(model, plan)
    pb = param_breakdown(model, plan)
    weights, consts = weight_bytes(model, plan, pb)
    adapters = pb.adapter * 4 if plan.peft else 0
    if vision.applies(model, plan):  # the tower and projector load with the language model (issue 41)
        tower = vision.estimate_vision(model, plan, None, 0.0)
        weights, consts, adapters = (weights + tower.weights, consts + tower.quant_constants,
                                     adapters + tower.adapter_weights)
    final = weights + consts + adapters
    if not plan.quantized:
        return int(final), int(final), "weights"
    n = max(a * b for a, b in model.linear_shapes().values())
    p = DTYPE_BYTES[plan.compute_dtype]
    if plan.four_bit:
        # Params4bit._quantize: the 16-bit tensor, its packed codes (n/2) and fp32 absmax (n/64 x 4); with
        # double quantization the fp32 absmax, absmax - mean and the 8-bit absmax coexist (functional.quantize_4bit)
        extra = n * p + (2 * n / NF4_BLOCK * 4 if plan.double_quant else 0)
    else:
        # Int8Params._quantize: the 16-bit value is still held while its fp16 copy is quantized (Bnb8bitQuantize)
        extra = n * p + n * 2
    return int(weights + consts + extra), int(final), "a 16-bit tensor being quantized"


def load_offload(model: ModelSpec, plan: Plan) -> tuple[int, int, str]:
    """DeepSpeed's (or FSDP's) initialisation of an offload plan.

    zero2_cpu: the model is moved to the GPU whole (``DeepSpeedEngine._configure_distributed_model``:
    ``module.to(device)``) and the ZeRO-2 optimizer builds one flat 16-bit buffer of the trainable
    parameters on the GPU (deepspeed/runtime/zero/stage_1_and_2.py ``bit16_groups_flat``; flattened on the
    GPU when it has room, else through the CPU). zero3_cpu: ``zero.Init`` partitions every parameter to
    the host as it is made, and loading gathers one module at a time (transformers integrations/deepspeed.py
    ``_load_state_dict_into_zero3_model``: ``GatheredParameters``), the largest being the embedding.
    """
    from advisor.memory.training import param_breakdown, weight_bytes

    pb = param_breakdown(model, plan)
    p = DTYPE_BYTES[plan.param_dtype]
    if plan.offload == "zero3_cpu":
        return largest_gathered_module(model, plan), 0, "one gathered module (ZeRO-3)"
    if plan.offload == "fsdp_cpu":
        # fully_shard moves one unit at a time to the GPU, shards it and sends the shard to the host
        # (_fsdp_init.py _move_states_to_device, then FSDPParam's offload); bitsandbytes' quantization constants
        # move with their weights (Params4bit.to) and stay
        _, consts = weight_bytes(model, plan, pb)
        tail = ((model.description.lm_head_params or model.embedding_params) + model.description.final_norm_params)
        unit = max(tail * p, max(layer.params for layer in model.description.layers) * p)
        return int(consts + unit), int(consts), "one FSDP unit at a time on its way to the host"
    weights, consts = weight_bytes(model, plan, pb)
    flat = pb.trainable * (4 if plan.peft else p)
    return int(weights + consts + flat), int(weights + consts + flat), "weights + the flat ZeRO-2 buffer"


def load_partitioned(model: ModelSpec, plan: Plan, gpus: int) -> tuple[int, int, str]:
    """Loading under ZeRO-3 or FSDP on ``gpus`` GPUs: each holds its 1/N of the weights, and one module is
    gathered whole at a time as its tensors are loaded (transformers integrations/deepspeed.py
    ``_load_state_dict_into_zero3_model``: ``zero.Init`` then ``GatheredParameters`` per module; FSDP wraps
    and shards unit by unit), the largest being the embedding or the largest linear."""
    from advisor.memory.training import param_breakdown, weight_bytes

    weights, consts = weight_bytes(model, plan, param_breakdown(model, plan))
    shard = (weights + consts) / gpus
    what = f"1/{gpus} of the weights + one gathered module"
    return int(shard + largest_gathered_module(model, plan)), int(shard), what


def largest_gathered_module(model: ModelSpec, plan: Plan) -> int:
    """Bytes of the largest module ZeRO-3 gathers whole while loading: the embedding or the largest linear."""
    return int(max(model.embedding_params, max(a * b for a, b in model.linear_shapes().values()))
               * DTYPE_BYTES[plan.param_dtype])


def run_phases(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, step: MemoryReport, *,
               load: tuple[int, int, str, Sequence[tuple[int, int]] | None] | None = None,
               source: str | None = None, evaluates: bool | None = None) -> RunPhases:
    """The phases of the run of ``plan``, from its training-step report at the longest batch.

    ``evaluates``: whether the run evaluates (a Trainer with an eval strategy); its eval phase is shown
    either way but sets the run's peak only when it runs. None: when the plan names an eval batch
    (``--eval-batch``; the exported configs do not evaluate), as generation-based evaluation runs when
    it names ``--max-new-tokens``.

    ``load``: (live peak, live at the end, what, allocation events) of a simulated load; without it the
    closed form (``load_estimate``) is used.

    A GRPO or DPO plan has its task's phases instead (advisor.memory.rl.rl_run_phases: generate, score, train,
    sync; precompute, train), which asks this function for the load and the save (``advisor.runtime.phases``
    chooses between the two).
    """
    from advisor.memory.overhead import outside_allocator_bytes

    src = source or step.source
    outside = outside_allocator_bytes(gpu)
    resident = resident_bytes(step)
    notes: list[str] = []
    phases: dict[str, PhaseMemory] = {}

    step_reserved = step.reserved_peak_bytes
    # phases without an allocation sequence take the replayed step's reserved/allocated ratio when there is one
    frac = step_reserved / step.tensor_peak_bytes - 1 if step_reserved and step.tensor_peak_bytes else None
    hows: dict[str, str] = {}

    def phase(name, live, what, *, source=src, events=None, included=True, extra_notes=()):
        reserved, hows[name] = reserved_for(int(live), gpu, events, plan=plan, fragmentation=frac)
        phases[name] = PhaseMemory(name, int(live), int(reserved), int(reserved + outside), source, what,
                                   included, tuple(extra_notes))

    # load
    gpus, sharding = step.sharded or (1, "ddp")
    if gpus > 1 and sharding in SHARDS_PARAMETERS and plan.offload == "none":
        live, _, what = load_partitioned(model, plan, gpus)
        phase("load", live, f"loading: {what}", source="estimated")
    elif load is not None and plan.offload == "none":
        live, _, what, events = load
        phase("load", live, f"loading: {what}", source="simulated", events=events)
    else:
        live, _, what = load_estimate(model, plan)
        phase("load", live, f"loading: {what}", source="estimated")

    # train: the step at the longest batch, as the backend measured it
    if step_reserved:
        hows["train"] = ("replayed through the caching-allocator model" if step.source == "simulated"
                         else "the backend's")
        phases["train"] = PhaseMemory("train", int(step.tensor_peak_bytes), int(step_reserved),
                                      int(max(step.peak_bytes, step_reserved + outside)), src,
                                      f"step at seq {plan.seq_len:,}, {step.peak_phase}")
    else:
        reserved, hows["train"] = reserved_for(step.tensor_peak_bytes, gpu)
        phases["train"] = PhaseMemory("train", int(step.tensor_peak_bytes), int(reserved), int(step.peak_bytes), src,
                                      f"step at seq {plan.seq_len:,}, {step.peak_phase}")

    # eval: no-grad forward with labels at the eval batch
    b = eval_batch(plan)
    t, where = forward_transient(model, plan, b, plan.seq_len, full_logits=True)
    eval_notes = [f"transformers' Trainer keeps each eval batch's logits on the GPU "
                  f"({b * plan.seq_len * model.vocab_size * DTYPE_BYTES[plan.activation_dtype] / 2**30:.2f} GiB "
                  f"per batch of {b}) unless prediction_loss_only=True or eval_accumulation_steps is set "
                  "(transformers #32282, LLaMA-Factory #5957); not counted here"]
    if plan.loss != "plain":
        eval_notes.append(f"the {plan.loss} loss applies to training steps; Trainer's prediction_step computes the "
                          "model's own loss over full logits")
    if evaluates is None:
        evaluates = plan.eval_batch > 0
    if not evaluates:
        eval_notes.insert(0, "no evaluation in this run (--eval-batch 0: the exported configs do not evaluate)")
    phase("eval", resident + t, f"forward, batch {b}: {where}", source="estimated", included=evaluates,
          extra_notes=eval_notes)

    # generate: KV cache for batch x (prompt + new tokens), prefill at the eval batch
    from advisor.memory.inference import kv_cache_bytes_per_token

    new = max_new_tokens(plan)
    kv = kv_cache_bytes_per_token(model, plan.activation_dtype if plan.activation_dtype != "fp32" else "bf16")
    if plan.activation_dtype == "fp32":
        kv *= 2
    prefill, where = forward_transient(model, plan, b, plan.seq_len, full_logits=False)
    cache = kv * b * (plan.seq_len + new)
    phase("generate", resident + cache + prefill, f"KV cache {b} x {plan.seq_len + new:,} tokens + prefill",
          source="estimated", included=new > 0,
          extra_notes=() if new > 0 else ("no generation-based evaluation (--max-new-tokens 0)",))

    # save
    if plan.offload == "zero3_cpu":
        gathered = max(model.embedding_params, max(a * b for a, b in model.linear_shapes().values())) * 2
        # stage3_gather_16bit_weights_on_model_save: DeepSpeedEngine._zero3_consolidated_16bit_state_dict gathers
        # one module's 16-bit parameters at a time (GatheredParameters) and copies them to the host
        phase("save", resident + gathered, "ZeRO-3 gathers one module's 16-bit weights", source="estimated")
    else:
        # safetensors copies each GPU tensor to the host before writing (safetensors/torch.py _to_ndarray:
        # "Moving tensor to cpu before saving"); torch.save copies storages to the host one at a time
        what = "adapter state dict, copied to host" if plan.peft else "full state dict, copied to host"
        phase("save", resident, what, source="estimated")
    notes.append("reserved memory stays cached from one phase to the next (no empty_cache): a later phase "
                 "reserves at least what an earlier one did")
    groups: dict[str, list[str]] = {}
    for n, h in hows.items():
        groups.setdefault(h, []).append(n)
    how = "; ".join(f"{h} ({', '.join(ns)})" for h, ns in groups.items()) if len(groups) > 1 else next(iter(groups))
    return RunPhases(cached_across(phases), how, tuple(notes))


def cached_across(phases: dict[str, PhaseMemory], order: Sequence[str] = PHASES) -> dict[str, PhaseMemory]:
    """Reserved memory carried from one phase to the next.

    The caching allocator keeps freed blocks in its segments until ``torch.cuda.empty_cache()``, which
    Trainer does not call by default (PyTorch docs, "CUDA semantics: memory management": "unused memory
    managed by the allocator will still show as if used in nvidia-smi"), so a phase starts with the
    segments of the phases before it: its reserved bytes are at least theirs, and grow only by what its
    live bytes exceed the earlier live peak by (the cached free blocks serve the rest). The run's reserved
    peak is set by the first phase that reaches it. Phases the run skips are shown as if they ran at
    their place, without carrying anything on.
    """
    out: dict[str, PhaseMemory] = {}
    reserved_so_far = live_so_far = 0
    for name in order:
        p = phases[name]
        carried = reserved_so_far + max(0, p.live_bytes - live_so_far) if reserved_so_far else 0
        reserved = max(p.reserved_bytes, carried)
        q = replace(p, reserved_bytes=int(reserved), peak_bytes=int(p.peak_bytes + reserved - p.reserved_bytes))
        out[name] = q
        if p.included:
            reserved_so_far, live_so_far = max(reserved_so_far, reserved), max(live_so_far, p.live_bytes)
    return out


def attach(report: MemoryReport, phases: RunPhases) -> MemoryReport:
    """``report`` with the run's phases attached (``report.run_phases``; its ``peak_bytes`` stays the step's)."""
    return replace(report, run_phases=phases)


def run_peak_bytes(report: MemoryReport) -> int:
    """The run's peak when phases are attached, else the step's peak (``MemoryReport.run_peak_bytes``)."""
    return report.run_peak_bytes
