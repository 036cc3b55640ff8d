"""Layer extrapolation: trace a few decoder layers, extend linearly to the full depth.

Decoder layers of one kind are identical, so every phase's peak (and every category of its ledger) is an
affine function of the number of layers L. One trace of three layers gives it: at each phase's peak, the middle
layer holds what one more layer adds (its parameters, gradients and states, what it saved for backward:
``deepened``, from the tracker's layer tags), so ``m(L) = m(3) + (L - 3) * held(middle)``. Where a phase peaks
inside the middle layer itself, a second trace of two layers gives ``m(L) = m(n2) + (L - n2) * (m(n2) - m(n1))``.
Each phase is extrapolated on its own and the largest taken, so a peak that moves from one phase to
another as L grows is still found. Proven against full traces in tests/test_simulate_extrapolate.py.

Layers of several kinds (Gemma-3's sliding and full attention, gpt-oss's alternating window, Qwen3-Next's
linear and full attention, DeepSeek's dense first layer; ``layer_kinds``) are each traced: memory is affine in the
number of layers of each kind. T_0 holds the model's first layers up to the first that trains, one middle layer of
each kind, and the layer the model ends on (``kind_traces``); each kind's middle layer is repeated to its count
(``deepened``). Where a phase peaks inside one of them, K more traces T_k, each one more middle layer of the k-th
kind than T_k-1, give ``m(n_1..n_K) = m(T_K) + sum_k (N_k - n_k(T_K)) * (m(T_k) - m(T_k-1))``. Proven against
full traces in tests/test_simulate_moe.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from advisor.core.catalog import ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan, checkpointed_layers, some_checkpointed
from advisor.runtime.simulate.disk_cache import kept
from advisor.runtime.simulate.runner import PhasePeak, StepTrace, trace_step

TRACE_LAYERS = (2, 3)   # the first layer's input is the embedding output; trace from two layers on
FULL_UP_TO = 4          # models this shallow are traced whole


@dataclass
class Simulation:
    """The memory of one step of the full model, traced or extrapolated."""

    peak_bytes: int
    peak_phase: str
    ledger: dict[str, int]
    phases: dict[str, PhasePeak]
    layers_traced: tuple[int, ...]
    extrapolated: bool
    seconds: float
    notes: list[str]
    traced_events: tuple = ()
    """(layers, allocation events, the layer of each event) of each trace, for the caching-allocator
    replay (reserved.py)."""
    layer_kinds: int = 1
    """Kinds of decoder layers traced (more than one: ``simulate_kinds``)."""


def simulate(spec: ModelSpec, plan: Plan, *, layers: str | int = "auto", fake: bool = True,
             target_device: str = "cuda") -> Simulation:
    """Simulate one step of ``plan`` on ``spec``: ``layers`` = "auto" (extrapolate deep models), "full",
    or a number of layers to trace whole (a partial model, for tests). A fake trace is kept on disk where
    ``$ADVISOR_SIMULATION_CACHE`` says (advisor.runtime.simulate.disk_cache)."""
    def trace() -> Simulation:
        return _simulate(spec, plan, layers=layers, fake=fake, target_device=target_device)

    if not fake:
        return trace()
    return kept(lambda: {"model": spec.to_dict(), "plan": plan.to_dict(), "layers": layers,
                         "target_device": target_device}, trace)


def _simulate(spec: ModelSpec, plan: Plan, *, layers: str | int, fake: bool, target_device: str) -> Simulation:
    start = time.perf_counter()
    L = spec.num_layers
    if layers == "full" or (layers == "auto" and L <= FULL_UP_TO) or isinstance(layers, int):
        n = L if not isinstance(layers, int) or isinstance(layers, bool) else layers
        t = trace_step(spec, plan, fake=fake, num_layers=n, target_device=target_device)
        return Simulation(t.peak_bytes, t.peak_phase, t.ledger, t.phases, (n,), False,
                          time.perf_counter() - start, t.notes, ((n, t.events, t.event_layers),))
    kinds = trace_kinds(spec, plan)
    if some_checkpointed(plan, L):
        return simulate_partial(spec, plan, fake=fake, target_device=target_device, start=start)
    if len(kinds) > 1:
        return simulate_kinds(spec, plan, kinds, fake=fake, target_device=target_device, start=start)
    n1, n2 = TRACE_LAYERS
    b = trace_step(spec, plan, fake=fake, num_layers=n2, target_device=target_device)
    phases = deepened(b, {MIDDLE: L - n2})
    if phases is not None:
        top = max(phases.values(), key=lambda p: p.bytes)
        return Simulation(top.bytes, top.phase, top.ledger, phases, (n2,), True, time.perf_counter() - start,
                          b.notes + [f"traced {n2} layers, the middle one repeated to {L}"],
                          ((n2, b.events, b.event_layers, {MIDDLE: L - n2}),))
    a = trace_step(spec, plan, fake=fake, num_layers=n1, target_device=target_device)
    phases = extrapolate_phases(a, b, L)
    top = max(phases.values(), key=lambda p: p.bytes)
    return Simulation(top.bytes, top.phase, top.ledger, phases, (n1, n2), True, time.perf_counter() - start,
                      b.notes, ((n1, a.events, a.event_layers), (n2, b.events, b.event_layers)))


MIDDLE = 1
"""The position of the middle layer in a trace of ``TRACE_LAYERS[1]`` layers (the first takes the embeddings'
output, the last starts the backward)."""

HELD_BY_A_LAYER = frozenset(("weights", "quant_constants", "adapter_weights", "gradients", "optimizer_states",
                             "master_weights", "activations"))
"""What one more decoder layer adds at a peak: what it keeps (its parameters, their gradients and optimizer states)
and what it saved for backward. A layer's transient tensors at a forward or backward peak are in flight (the
gradient on its way to the layer before), held once whatever the depth; at the optimizer's peak a foreach step holds
one temporary per parameter, so there they count as well."""


def deepened(trace: StepTrace, extras: dict[int, int]) -> dict[str, PhasePeak] | None:
    """Each phase of the full model from one trace: its ledger at the peak plus, for each middle layer (its
    position in the trace), ``extras[position]`` copies of what that layer holds at that moment (``PhasePeak.by_layer``,
    ``HELD_BY_A_LAYER``). Decoder layers of one kind are identical, so this is what the same number of layers more
    hold (tests/test_simulate_extrapolate.py and tests/test_simulate_moe.py hold it to full traces). None when a phase
    peaks inside one of those layers, where its own temporaries would be copied too: the caller traces more
    layers and extends by differences instead."""
    out = {}
    for name, ph in trace.phases.items():
        if ph.at_layer in extras:
            return None
        ledger = dict(ph.ledger)
        host = ph.host_bytes
        for position, n in extras.items():
            for c, v in ph.by_layer.get(position, {}).items():
                if c in HELD_BY_A_LAYER or (name == "optimizer" and c == "transient"):
                    ledger[c] = ledger.get(c, 0) + n * v
            host += n * ph.host_by_layer.get(position, 0)
        # a vision-language model's tower and projector are outside the decoder layers: the same at any depth
        out[name] = PhasePeak(name, sum(ledger.values()), ledger, host_bytes=host, parts=ph.parts)
    return out


def extrapolate_phases(a: StepTrace, b: StepTrace, L: int) -> dict[str, PhasePeak]:
    k = (L - b.num_layers) / (b.num_layers - a.num_layers)
    out = {}
    for name in b.phases:
        if name not in a.phases:
            continue
        pa, pb = a.phases[name], b.phases[name]
        ledger = {c: max(0, round(pb.ledger[c] + k * (pb.ledger[c] - pa.ledger[c]))) for c in pb.ledger}
        host = max(0, round(pb.host_bytes + k * (pb.host_bytes - pa.host_bytes)))
        # a vision-language model's tower and projector are the same in both traces (advisor.runtime.simulate.vision)
        out[name] = PhasePeak(name, sum(ledger.values()), ledger, host_bytes=host, parts=pb.parts)
    return out


def trace_kinds(spec: ModelSpec, plan: Plan) -> list[tuple[int, ...]]:
    """The decoder layers of ``spec`` grouped by what their memory depends on under ``plan``: their modules and
    shapes, and their attention (a sliding window at least as long as the sequence attends as full attention
    does: transformers then skips the mask, masking_utils ``_ignore_causal_mask_sdpa``). Each group is the
    indices of its layers, in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for layer in spec.description.layers:
        attention, window = layer.attention, layer.sliding_window
        if attention == "sliding" and window and plan.seq_len < window:
            attention, window = "full", None
        key = (attention, window, layer.linears, layer.experts, layer.num_experts, layer.router_params,
               layer.norms, layer.other_params)
        groups.setdefault(key, []).append(layer.index)
    return [tuple(ix) for ix in groups.values()]


def first_trainable_layer(spec: ModelSpec, plan: Plan) -> int | None:
    """The first decoder layer whose input or parameters need a gradient under ``plan`` (None: not known). Every
    layer after it has an input that needs one, so it saves for backward what a middle layer of its kind does,
    wherever it stands. Full fine-tuning trains every layer; checkpointing the whole decoder the way Trainer does
    makes the embeddings' output need a gradient (transformers ``activation_checkpointing_enable`` calls
    ``enable_input_require_grads``, advisor.runtime.build); LoRA trains the first layer holding a target."""
    if not plan.peft:
        return 0
    whole = plan.gradient_checkpointing and plan.checkpoint_layers is None and not plan.activation_offload
    if whole:
        return 0
    from advisor.core.adapters import lora_targets

    targets = set(lora_targets(spec, plan)[0])
    for layer in spec.description.layers:
        if any(m.name.rsplit(".", 1)[-1] in targets for m in layer.linears) or (plan.lora_experts and layer.experts):
            return layer.index
    return None


def kind_traces(spec: ModelSpec, kinds: list[tuple[int, ...]], plan: Plan | None = None
                ) -> tuple[list[tuple[int, ...]], list[int], int]:
    """(the layers of each trace T_0..T_m, the kind each later trace adds, where it adds it).

    T_0 is the model's own first layers up to the first one whose input or parameters need a gradient under ``plan``
    (``first_trainable_layer``: the layers before it save nothing for backward, and are there as in the model; without
    a plan, up to the first layer of every kind), then one middle layer of each kind
    the model has more of, then one layer of the kind the model ends on (the backward starts there). Each later
    trace adds one more layer of one of those kinds among the middle ones: with every kind already in the middle,
    the layer whose backward holds the most is in every trace, and each difference is what one more layer of a kind
    keeps (its saved activations, weights, states), as the layers the extrapolation adds. Layers are indices of the
    full model."""
    first = [k[0] for k in kinds]
    lead = first_trainable_layer(spec, plan) if plan is not None else None
    prefix = list(range((lead if lead is not None else max(first)) + 1))
    last_kind = next(k for k, ix in enumerate(kinds) if spec.num_layers - 1 in ix)
    last = kinds[last_kind][-1]
    kind_of = {i: k for k, ix in enumerate(kinds) for i in ix}
    ends = prefix + [last]
    middle = [k for k, ix in enumerate(kinds) if len(ix) > sum(1 for i in ends if kind_of[i] == k)]
    more = [k for k in middle if len(kinds[k]) > sum(1 for i in ends if kind_of[i] == k) + 1]
    at = len(prefix)
    base = prefix + [kinds[k][0] for k in middle] + [last]
    traces = [tuple(base)]
    for k in more:
        prev = list(traces[-1])
        traces.append(tuple(prev[:at] + [kinds[k][0]] + prev[at:]))
    return traces, more, at


def simulate_kinds(spec: ModelSpec, plan: Plan, kinds: list[tuple[int, ...]], *, fake: bool, target_device: str,
                   start: float) -> Simulation:
    """Layers of several kinds: one trace with each kind's middle layer repeated, or (a phase peaking inside one of
    them) K + 1 traces, extended affinely in the number of layers of each kind."""
    traces_layers, added, at = kind_traces(spec, kinds, plan)
    kind_of = {i: k for k, ix in enumerate(kinds) for i in ix}
    d = spec.description
    names = []
    for ix in kinds:
        layer = d.layers[ix[0]]
        what = layer.attention + (f"({layer.sliding_window})" if layer.sliding_window and plan.seq_len >= (
            layer.sliding_window or 0) else "") + (" moe" if layer.num_experts else (" dense" if d.is_moe else ""))
        names.append(f"{what} x{len(ix)}")
    try:
        traces = [trace_step(spec, plan, fake=fake, layers=traces_layers[0], target_device=target_device)]
        first = traces_layers[0]
        middles = {}  # the middle layer of each kind the model has more of: its position in the first trace
        for k in added:
            position = next(p for p in range(at, len(first) - 1) if kind_of[first[p]] == k)
            middles[position] = len(kinds[k]) - sum(1 for i in first if kind_of[i] == k)
        phases = deepened(traces[0], middles)
        if phases is not None:
            top = max(phases.values(), key=lambda p: p.bytes)
            note = (f"layers of {len(kinds)} kinds ({', '.join(names)}): traced {len(first)} layers (the model's "
                    f"first layers, then one of each kind), each kind's middle layer repeated to {spec.num_layers}")
            return Simulation(top.bytes, top.phase, top.ledger, phases, (len(first),), True,
                              time.perf_counter() - start, traces[0].notes + [note],
                              ((len(first), traces[0].events, traces[0].event_layers, middles),),
                              layer_kinds=len(kinds))
        traces += [trace_step(spec, plan, fake=fake, layers=t, target_device=target_device)
                   for t in traces_layers[1:]]
    except ValueError as e:
        raise AdvisorInputError("--model", f"cannot build the layers of {spec.name} chosen for the extrapolation ({e})",
                                spec.name, show_value=False) from e
    last = traces[-1]
    counts = [sum(1 for i in traces_layers[-1] if kind_of[i] == k) for k in range(len(kinds))]
    phases = {}
    for name in last.phases:
        if any(name not in t.phases for t in traces):
            continue
        ledger = {}
        for c in last.phases[name].ledger:
            value = last.phases[name].ledger[c]
            for step, k in enumerate(added):
                delta = traces[step + 1].phases[name].ledger[c] - traces[step].phases[name].ledger[c]
                value += (len(kinds[k]) - counts[k]) * delta
            ledger[c] = max(0, round(value))
        host = last.phases[name].host_bytes
        for step, k in enumerate(added):
            host += (len(kinds[k]) - counts[k]) * (traces[step + 1].phases[name].host_bytes
                                                    - traces[step].phases[name].host_bytes)
        phases[name] = PhasePeak(name, sum(ledger.values()), ledger, host_bytes=max(0, round(host)),
                                 parts=last.phases[name].parts)
    top = max(phases.values(), key=lambda p: p.bytes)
    note = (f"layers of {len(kinds)} kinds ({', '.join(names)}): traced "
            f"{', '.join(str(len(t)) for t in traces_layers)} layers (the model's first layers, then one more of "
            f"each kind), extrapolated to {spec.num_layers}")
    # the allocator replay: the last trace, one middle layer of each kind repeated up to the model's count (the
    # layers the traces added sit at ``at`` onwards, the last added first)
    extras = {at + len(added) - 1 - step: len(kinds[k]) - counts[k] for step, k in enumerate(added)}
    events = ((len(traces_layers[-1]), last.events, last.event_layers, extras),)
    return Simulation(top.bytes, top.phase, top.ledger, phases, tuple(len(t) for t in traces_layers), True,
                      time.perf_counter() - start, last.notes + [note], events, layer_kinds=len(kinds))


def checkpoint_units(spec: ModelSpec, plan: Plan) -> tuple[list[int], dict[tuple, list[tuple[int, ...]]], list[int]]:
    """Some of the layers checkpointed: (the layers up to the first that trains, as in the model; the units below
    the last checkpointed layer, by kind; the model's layers from the last checkpointed one on).

    A unit is a checkpointed layer and the plain layers after it up to the next checkpointed one. What a layer
    keeps depends on the layer after it as well as on itself (a checkpointed layer's output is kept as the next
    checkpointed layer's saved input, while a plain layer's norm saves its own fp32 copy), and every unit is
    followed by a checkpointed layer, so units of the same layers (their modules, shapes, attention:
    ``trace_kinds``) keep the same wherever they stand."""
    L = spec.num_layers
    checkpointed = sorted(checkpointed_layers(plan, L))
    kind_of = {i: k for k, ix in enumerate(trace_kinds(spec, plan)) for i in ix}
    lead = first_trainable_layer(spec, plan)
    lead = L - 1 if lead is None else lead
    top = checkpointed[-1]
    starts = [i for i in checkpointed if i < top] + [top]
    prefix_end = next((b for b in starts if b > lead), top)   # the prefix ends where a unit starts
    units: dict[tuple, list[tuple[int, ...]]] = {}
    for a, b in zip(starts, starts[1:]):
        if a >= prefix_end:
            unit = tuple(range(a, b))
            units.setdefault(tuple(kind_of[i] for i in unit), []).append(unit)
    return list(range(prefix_end)), units, list(range(max(top, prefix_end), L))


def simulate_partial(spec: ModelSpec, plan: Plan, *, fake: bool, target_device: str, start: float) -> Simulation:
    """Some of the layers checkpointed (every n-th, or one per span: ``checkpointed_layers``): one trace of the
    model's first layers, one unit of each kind (``checkpoint_units``) and the model's own layers from the last
    checkpointed one on, each unit's layers repeated to the count of its kind (``deepened``).

    Going down the backward, a checkpointed layer's recompute holds what every layer below it saved, so the last
    one's holds the most; the plain layers above it are freed by then; at the backward's start every layer below
    holds what it saved; the forward peaks on the last layer. Each of those moments is in the trace, every unit
    below it. Where a phase peaks inside a repeated unit instead, all layers are traced.
    tests/test_simulate_extrapolate.py holds it to whole traces."""
    L = spec.num_layers
    checkpointed = set(checkpointed_layers(plan, L))
    prefix, units, tail = checkpoint_units(spec, plan)
    layers = list(prefix)
    extras: dict[int, int] = {}
    for group in units.values():
        for i in group[0]:
            extras[len(layers)] = len(group) - 1
            layers.append(i)
    layers += tail
    note = (f"{len(checkpointed)} of {L} layers checkpointed: traced {len(layers)} (the first, one run of each kind "
            f"from a checkpointed layer to the next, the layers from the last checkpointed one on), each run "
            f"repeated to {L}")
    if len(layers) < L:
        t = trace_step(spec, plan, fake=fake, layers=tuple(layers), target_device=target_device,
                       checkpoint_set=tuple(p for p, i in enumerate(layers) if i in checkpointed))
        phases = deepened(t, extras)
        if phases is not None:
            top = max(phases.values(), key=lambda p: p.bytes)
            return Simulation(top.bytes, top.phase, top.ledger, phases, (len(layers),), True,
                              time.perf_counter() - start, t.notes + [note],
                              ((len(layers), t.events, t.event_layers, extras),))
    t = trace_step(spec, plan, fake=fake, num_layers=L, target_device=target_device)
    return Simulation(t.peak_bytes, t.peak_phase, t.ledger, t.phases, (L,), False, time.perf_counter() - start,
                      t.notes + [f"traced all {L} layers: some of them checkpointed, and a phase peaks inside a "
                                 f"run of layers that would be repeated"], ((L, t.events, t.event_layers),))
