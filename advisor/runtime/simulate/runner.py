"""Run one training step under the tracker: warm-up step, then one measured step, ledger at the peak.

Measurement protocol (written down, as nanoGPT's bench.py does):
1. build the setup inside the tracker (every parameter, buffer and constant is a recorded storage);
2. warm-up: one full step (``grad_accum`` micro-steps and the optimizer step), so optimizer state
   exists and lazy buffers are made, as in every step after the first;
3. reset the peak; run the measured step with phase marks (forward, backward, optimizer, zero_grad);
4. classify the storages live at each phase's peak: parameters, quantization constants, gradients
   and optimizer states by identity; saved activations by autograd's saved-tensor hook (and anything
   made in the forward that outlives it); the rest is transient.

``cuda_semantics`` makes the CPU run the ops CUDA would run where the two differ in memory.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field

from advisor.core.catalog import ModelSpec
from advisor.memory.ledger import CATEGORIES
from advisor.core.plan import Plan
from advisor.core.packed_docs import builds_packed_mask

PHASES = ("forward", "backward", "optimizer")
PACKED = {"on": False}
"""Whether the traced plan packs documents (cuda_semantics reads it for fake position ids)."""
LARGEST = 16  # storages listed in PhasePeak.largest


@dataclass
class PhasePeak:
    """The highest live bytes within one phase of the measured step, and the ledger at that moment."""

    phase: str
    bytes: int
    ledger: dict[str, int]
    largest: list = field(default_factory=list)
    """The largest live storages at the peak: (bytes, category, op that made it, phase it was made in)."""
    host_bytes: int = 0
    """The most bytes in host memory during the phase (offloaded activations)."""
    by_layer: dict = field(default_factory=dict)
    """Decoder layer (its position in the traced model) -> category -> bytes it holds at the peak: what it made
    and what is its own (weights, states; ``tag_layers``, ``tag_layer_storages``)."""
    host_by_layer: dict = field(default_factory=dict)
    """Decoder layer -> host bytes it holds at the peak (offloaded copies it made)."""
    at_layer: int | None = None
    """The decoder layer running when the peak was reached (None: outside the layers)."""
    parts: dict = field(default_factory=dict)
    """A vision-language model's tower and projector at the peak: {part: {category: bytes}}, bytes that are in
    ``ledger`` too (advisor.runtime.simulate.vision)."""


@dataclass
class StepTrace:
    """What one traced step says about memory."""

    num_layers: int
    peak_bytes: int
    peak_phase: str
    ledger: dict[str, int]
    phases: dict[str, PhasePeak]
    baseline_bytes: int
    """Live bytes when the measured step begins (weights, constants, optimizer states)."""
    seconds: float
    fake: bool
    notes: list[str] = field(default_factory=list)
    events: list = field(default_factory=list)
    """Allocations and frees from the warm-up step on (what was live before it allocated fresh, in
    order), for the caching-allocator replay (advisor.runtime.simulate.reserved)."""
    event_layers: list = field(default_factory=list)
    """For each event, the decoder layer it happened in, or None (``tag_layers``)."""
    parts: dict = field(default_factory=dict)
    """The peak phase's ``PhasePeak.parts``."""


@contextlib.contextmanager
def cuda_semantics():
    """Where the CPU build of torch decomposes an op differently from CUDA, run CUDA's op.

    - ``F.dropout`` on the CPU is ``bernoulli_`` noise in the input's dtype, saved for backward (4 B per
    element for fp32 LoRA inputs); on CUDA it is the fused ``native_dropout`` that saves a bool mask
    (aten/src/ATen/native/Dropout.cpp ``is_fused_kernel_acceptable``). ``native_dropout`` has a CPU
    kernel too, so call it.
    - transformers' causal mask: see ``ignore_causal_mask`` below.
    """
    import torch
    import torch.nn.functional as F
    from transformers import masking_utils

    original = F.dropout
    original_skip = masking_utils._ignore_causal_mask_sdpa

    def ignore_causal_mask(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        # transformers builds an explicit s x s causal mask when the cache position is a fake tensor (it
        # cannot read it) where a real run passes is_causal=True to sdpa; without padding and without a
        # cache, decide as the real run does (masking_utils._ignore_causal_mask_sdpa)
        from torch._subclasses.fake_tensor import FakeTensor

        if (padding_mask is None and isinstance(q_offset, FakeTensor) and q_length == kv_length
                and (local_attention_size is None or kv_length < local_attention_size)):
            return True
        return original_skip(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)

    original_packed = masking_utils.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids):
        # the same for packed sequences: a real run reads the position ids; it finds none in the ids the model
        # makes itself, and the documents of advisor.runtime.build.packed_position_ids when the plan packs
        # (PACKED["on"]); a fake tensor cannot be read, so decide as the real run does and run its ops
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(position_ids, FakeTensor):
            return original_packed(position_ids)
        if not PACKED["on"]:
            return None
        first = position_ids[:, :1] - 1
        return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and not inplace and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    F.dropout = dropout
    masking_utils._ignore_causal_mask_sdpa = ignore_causal_mask
    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        F.dropout = original
        masking_utils._ignore_causal_mask_sdpa = original_skip
        masking_utils.find_packed_sequence_indices = original_packed


TRACED_MICRO_STEPS = 2
"""Micro-batches a traced step runs of its ``grad_accum``: the first allocates the gradients, the second adds
into them, and every later one repeats the second allocation for allocation (the same shapes, into the same
gradient buffers), so two give the step's peak and its allocation pattern (tests/test_simulate.py holds a
traced step of 2 to one of the whole accumulation)."""


def trace_step(spec: ModelSpec, plan: Plan, *, fake: bool = True, num_layers: int | None = None,
               target_device: str = "cuda", quant_impl: str = "auto", seed: int = 0,
               checkpoint_set: tuple[int, ...] | None = None, layers: tuple[int, ...] | None = None,
               micro_steps: int | None = TRACED_MICRO_STEPS, vision=None, tower_layers: int | None = None,
               sp_rank: int = 0) -> StepTrace:
    """Trace warm-up + one measured step of ``plan`` on ``spec`` (``num_layers`` decoder layers, or the layers of
    the full model at the indices ``layers``: advisor.runtime.build.select_layers), each of ``micro_steps``
    micro-batches (None: all ``grad_accum`` of them).

    GaLore / APOLLO: the measured step updates the projection (``update_proj_gap`` 1 in the trace), the
    step every ``optim_proj_gap`` steps whose SVD / random projection is the optimizer's memory spike.

    A vision-language model (advisor.runtime.simulate.vision): ``vision`` its settings (default: the plan's),
    ``tower_layers`` the tower's blocks to build; its tower and projector are tagged apart (``PhasePeak.parts``).
    """
    import torch
    from torch._subclasses import FakeTensorMode

    from advisor.core.plan import LOW_RANK_OPTIMIZERS
    from advisor.runtime.build import build_training_setup, host_allocations
    from advisor.runtime.simulate.standins import quant_constant_tensors
    from advisor.runtime.simulate.tracker import LiveBytes
    from advisor.memory.sequence_parallel import rank_plan
    from advisor.runtime.simulate.sequence_parallel import ulysses_rank

    start = time.perf_counter()
    tracker = LiveBytes()
    saved: set[int] = set()

    def pack(t):
        rec = tracker.record_of(t)
        if rec is not None:
            saved.add(rec.uid)
        return t

    fake_mode = FakeTensorMode() if fake else contextlib.nullcontext()
    marks: dict[str, int] = {}
    ids: dict[str, set[int]] = {"gradients": set(), "optimizer_states": set()}
    phase_peaks: dict[str, tuple[int, int]] = {}
    measuring = {"on": False}
    forward_begin = {"clock": 0}

    host_peaks: dict[str, int] = {}
    host_peak_clocks: dict[str, int] = {}

    def close_phase():
        if measuring["on"] and tracker.phase in PHASES:
            best = phase_peaks.get(tracker.phase)
            if best is None or tracker.peak.bytes > best[0]:
                phase_peaks[tracker.phase] = (tracker.peak.bytes, tracker.peak.clock)
            if tracker.host_peak > host_peaks.get(tracker.phase, -1):
                host_peaks[tracker.phase] = tracker.host_peak
                host_peak_clocks[tracker.phase] = tracker.host_peak_clock

    def on_grad(p):
        # gradients an update inside backward frees before zero_grad (LOMO, optimizer_in_backward)
        rec = tracker.record_of(p.grad) if measuring["on"] and p.grad is not None else None
        if rec is not None:
            ids["gradients"].add(rec.uid)

    def hook(name: str) -> None:
        close_phase()
        if name == "backward":
            # whatever the forward made and is still alive is held for backward (graph, loss)
            for rec in tracker.live_at(tracker.clock):
                if rec.born > forward_begin["clock"]:
                    saved.add(rec.uid)
        if name == "zero_grad" and measuring["on"]:
            for p in setup.model.parameters():
                rec = tracker.record_of(p.grad) if p.grad is not None else None
                if rec is not None:
                    ids["gradients"].add(rec.uid)
            for v in optimizer_state_tensors(setup.optimizer):
                rec = tracker.record_of(v)
                if rec is not None:
                    ids["optimizer_states"].add(rec.uid)
            if multimodal:
                vl.tag_part_storages(setup.model, tracker, setup.optimizer)
        if name == "forward":
            forward_begin["clock"] = tracker.clock
            if measuring["on"] and not ids.get("params"):
                # the parameters' storages as the measured step begins (GaLore's 8-bit step swaps p.data)
                ids["params"] = {rec.uid for p in setup.model.parameters()
                                 if (rec := tracker.record_of(p)) is not None
                                 and (not plan.peft or not p.requires_grad)}
                # and the optimizer's state (GaLore / APOLLO replace their projection at the update step)
                for v in optimizer_state_tensors(setup.optimizer) if setup.optimizer is not None else ():
                    if (rec := tracker.record_of(v)) is not None:
                        ids["optimizer_states"].add(rec.uid)
        tracker.phase = name if name in PHASES else tracker.phase
        tracker.layer = None
        tracker.part = None
        tracker.reset_peak()
        tracker.host_peak, tracker.host_peak_clock = tracker.host_bytes, tracker.clock
        marks.setdefault(name, tracker.clock)

    gap = 1 if plan.optimizer in LOW_RANK_OPTIMIZERS else None
    sharded = plan if plan.sp_degree > 1 else None  # a sequence-parallel plan: its rank's shard is what is traced
    plan = rank_plan(plan)
    # a fake tensor's packed rows are read as the real run reads its position ids: sdpa / eager mask rows of two or
    # more documents; flash-attention's mask interface returns None (it runs varlen on cu_seqlens)
    PACKED["on"] = builds_packed_mask(plan)
    from advisor.runtime.simulate import vision as vl

    multimodal = vl.is_vision(spec)
    if multimodal:
        from advisor.runtime.simulate.vision_shadow import shadow_values
    shadow = shadow_values() if multimodal and fake else contextlib.nullcontext()
    with cuda_semantics(), offload_semantics(), fake_mode, shadow, tracker, host_allocations(tracker.on_host, pack), \
            contextlib.ExitStack() as exchange:
        # built outside the saved-tensor hook: a graph made while building (DoRA's weight norm at peft's
        # init, never backpropagated) would stay alive through the hook's reference to its own output
        if multimodal:
            setup = vl.build_vision_setup(spec, plan, vision, device="cpu", num_layers=num_layers,
                                          tower_layers=tower_layers, layers=layers, seed=seed,
                                          target_device=target_device, on_grad=on_grad,
                                          checkpoint_set=checkpoint_set)
        else:
            setup = build_training_setup(spec, plan, device="cpu", num_layers=num_layers, quant_impl=quant_impl,
                                         seed=seed, target_device=target_device, checkpoint_set=checkpoint_set,
                                         on_grad=on_grad, proj_gap=gap, layers=layers)
        if sharded is not None:
            setup.shard = (sp_rank, sharded.sp_degree)
            exchange.enter_context(ulysses_rank(setup.model, sharded))
        layer_hooks = tag_layers(_decoder_layers(setup.model), tracker)
        if multimodal:
            layer_hooks += vl.tag_parts(setup.model, tracker)
        tag_layer_storages(_decoder_layers(setup.model), tracker, None)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            batches = [setup.make_batch(i) for i in range(min(plan.grad_accum, micro_steps or plan.grad_accum))]
            setup.phase_hook = hook
            warm_clock = tracker.clock
            setup.train_step(batches)  # warm-up
            tag_layer_storages(_decoder_layers(setup.model), tracker, setup.optimizer)
            if multimodal:
                vl.tag_part_storages(setup.model, tracker, setup.optimizer)
            measuring["on"] = True
            tracker.phase = "baseline"
            baseline = tracker.live_bytes
            setup.train_step(batches)  # measured
            close_phase()
            measuring["on"] = False
        for handle in layer_hooks:
            handle.remove()
        tag_layer_storages(_decoder_layers(setup.model), tracker, setup.optimizer)
        # identities of what persists, while the setup is alive
        groups = _identity_groups(tracker, setup, quant_constant_tensors(setup.model), plan)
        for rec_uid in ids.get("params", ()):
            groups.setdefault(rec_uid, "weights")
        for rec_uid in ids["gradients"]:
            groups.setdefault(rec_uid, "gradients")
        for rec_uid in ids["optimizer_states"]:
            groups.setdefault(rec_uid, "optimizer_states")
        for rec_uid in saved:
            groups.setdefault(rec_uid, "activations")
        phases = {}
        for phase, (nbytes, clock) in phase_peaks.items():
            ledger = {c: 0 for c in CATEGORIES}
            live = tracker.live_at(clock)
            for rec in live:
                ledger[groups.get(rec.uid, "transient")] += rec.nbytes
            largest = sorted(((r.nbytes, groups.get(r.uid, "transient"), r.op, r.phase) for r in live
                              if groups.get(r.uid) not in ("weights", "quant_constants")), reverse=True)[:LARGEST]
            by_layer: dict[int, dict[str, int]] = {}
            for rec in live:
                if rec.layer is not None:
                    cats = by_layer.setdefault(rec.layer, {})
                    cat = groups.get(rec.uid, "transient")
                    cats[cat] = cats.get(cat, 0) + rec.nbytes
            host_by_layer: dict[int, int] = {}
            host_clock = host_peak_clocks.get(phase)
            for rec in tracker.host_live_at(host_clock) if host_clock is not None else ():
                if rec.layer is not None:
                    host_by_layer[rec.layer] = host_by_layer.get(rec.layer, 0) + rec.nbytes
            at = next((r.layer for r in tracker.records if r.born == clock), None) if clock else None
            parts = vl.parts_ledger(live, groups) if multimodal else {}
            phases[phase] = PhasePeak(phase, nbytes, ledger, largest, host_peaks.get(phase, 0), by_layer,
                                      host_by_layer, at, parts)
        notes = list(setup.notes)
        layers = len(_decoder_layers(setup.model))
        events, event_layers = tracker.allocator_events(warm_clock, layers=True)
    top = max(phases.values(), key=lambda p: p.bytes)
    return StepTrace(num_layers=layers, peak_bytes=top.bytes, peak_phase=top.phase, ledger=top.ledger,
                     phases=phases, baseline_bytes=baseline, seconds=time.perf_counter() - start, fake=fake,
                     notes=notes, events=events, event_layers=event_layers, parts=top.parts)


@contextlib.contextmanager
def offload_semantics():
    """transformers' checkpoint offload (``save_on_cpu(pin_memory=True)`` around ``checkpoint``) with the
    host copies labelled host memory: the same hooks, ``advisor.build.offload_hooks`` in save_on_cpu's mode
    (every saved tensor copied out, copied back in backward)."""
    from transformers import modeling_utils

    from advisor.runtime.build import offload_hooks

    original = modeling_utils.save_on_cpu
    modeling_utils.save_on_cpu = lambda pin_memory=False, device_type="cuda": offload_hooks(0, False)
    try:
        yield
    finally:
        modeling_utils.save_on_cpu = original


def optimizer_state_tensors(optimizer) -> list:
    """Every tensor an optimizer keeps between steps: its states, the inner tensors of torchao's quantized
    state subclasses, GaLore / APOLLO projection matrices, the per-parameter optimizers of layer-wise GaLore
    and of an update inside backward."""
    out = []
    for opt in _optimizers(optimizer):
        for state in getattr(opt, "state", {}).values():
            for v in state.values():
                out += state_tensors(v)
        # AdaLomo keeps its factored second moments as attributes, name -> tensor (lomo_optim/adalomo.py)
        for attr in ADALOMO_STATES:
            held = getattr(opt, attr, None)
            if isinstance(held, dict):
                for v in held.values():
                    out += state_tensors(v)
    return out


ADALOMO_STATES = ("exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col")
"""AdaLomo's factored second moments: attributes of the optimizer, parameter name -> tensor (lomo_optim/adalomo.py)."""


def _optimizers(optimizer) -> list:
    """The optimizer, or the per-parameter ones it holds (layer-wise GaLore, an update inside backward)."""
    inner = getattr(optimizer, "optimizer_dict", None) or getattr(optimizer, "optimizers", None)
    return list(inner.values()) if isinstance(inner, dict) else [optimizer]


def state_tensors(v) -> list:
    """The plain tensors of one optimizer state value: the inner tensors of torchao's quantized state subclasses,
    a GaLore / APOLLO projector's matrix, each tensor of a list."""
    import torch

    if isinstance(v, torch.Tensor):
        if hasattr(v, "__tensor_flatten__") and type(v) is not torch.Tensor and not _is_fake_tensor(v):
            names, _ = v.__tensor_flatten__()
            return [t for n in names for t in state_tensors(getattr(v, n))]
        return [v]
    if hasattr(v, "ortho_matrix"):
        return state_tensors(v.ortho_matrix)
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in state_tensors(x)]
    return []


def _is_fake_tensor(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def tag_layers(layers, tracker) -> list:
    """Tag what each decoder layer allocates and frees with its index (``tracker.layer``).

    A layer's forward runs from its forward pre-hook to the next layer's, so the free of the previous
    layer's output as the model's loop moves on counts as this layer's. Its backward ends when the
    gradient of its input is complete: a hook on that input sets the previous layer
    (torch.Tensor.register_hook fires once the gradient is computed), which is also where the previous
    layer's backward, and under checkpointing its recomputation, begins (transformers'
    GradientCheckpointingLayer checkpoints ``forward``, not ``__call__``, so the recomputation fires no
    module hook). The phase hooks reset the tag, so the loss, the last layer's backward and its
    recomputation, and the optimizer step are untagged or tagged to their own layer, never to a middle
    one. Forward hooks only: module backward hooks break on peft models. The previous layer is the one that
    ran before it, not the index before it: a layer the model skips (Mllama's cross-attention without an image)
    calls no hook and has no backward.
    """
    import torch

    ran = [-1]  # the layer whose forward began last (each forward restarts from the first layer)

    def pre_hook(index):
        def hook(_module, args, kwargs):
            before = ran[0] if 0 <= ran[0] < index else None
            ran[0] = index

            def set_previous(_grad):
                tracker.layer = before

            tracker.layer = index
            h = args[0] if args else kwargs.get("hidden_states")
            if isinstance(h, torch.Tensor) and h.requires_grad:
                h.register_hook(set_previous)
        return hook

    return [layer.register_forward_pre_hook(pre_hook(i), with_kwargs=True) for i, layer in enumerate(layers)]


def tag_layer_storages(layers, tracker, optimizer) -> None:
    """What a layer keeps from step to step is the layer's too: its parameters, buffers, quantization
    constants and its parameters' optimizer states (made before the trace's clock or in the untagged
    optimizer step)."""
    from advisor.runtime.simulate.standins import quant_constant_tensors

    opts = _optimizers(optimizer) if optimizer is not None else []
    for index, layer in enumerate(layers):
        params = list(layer.parameters())
        tensors = [*params, *layer.buffers(), *quant_constant_tensors(layer)]
        for opt in opts:
            states = getattr(opt, "state", None) or {}
            for p in params:
                state = states.get(p) if hasattr(states, "get") else None
                tensors += [t for v in (state or {}).values() for t in state_tensors(v)]
        for t in tensors:
            rec = tracker.record_of(t)
            if rec is not None:
                rec.layer = index
    # AdaLomo keys its states by parameter name: "...layers.<index>...."
    for opt in opts:
        for attr in ADALOMO_STATES:
            held = getattr(opt, attr, None)
            for name, v in (held.items() if isinstance(held, dict) else ()):
                found = re.search(r"layers\.(\d+)\.", name)
                for t in state_tensors(v) if found else ():
                    rec = tracker.record_of(t)
                    if rec is not None:
                        rec.layer = int(found.group(1))


def _decoder_layers(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    # a vision-language model's decoder layers are its language model's (SmolVLM's ``text_model``)
    for name in ("language_model", "text_model"):
        if hasattr(inner, name):
            return getattr(inner, name).layers
    return inner.layers


def _identity_groups(tracker, setup, constants, plan: Plan) -> dict[int, str]:
    """uid -> category for parameters, buffers and quantization constants."""
    groups: dict[int, str] = {}
    for t in constants:
        rec = tracker.record_of(t)
        if rec is not None:
            groups[rec.uid] = "quant_constants"
    for p in setup.model.parameters():
        rec = tracker.record_of(p)
        if rec is None:
            continue
        if p.requires_grad and plan.peft:
            groups.setdefault(rec.uid, "adapter_weights")
        else:
            groups.setdefault(rec.uid, "weights")
    for b in setup.model.buffers():
        rec = tracker.record_of(b)
        if rec is not None:
            groups.setdefault(rec.uid, "weights")
    return groups
