"""Layer extrapolation: trace a few decoder layers, extend linearly to the full depth.

Decoder layers are identical, so every phase's peak (and every category of its ledger) is an
affine function of the number of layers L: ``m(L) = m(n2) + (L - n2) * (m(n2) - m(n1))``. Each
phase is extrapolated on its own and the largest taken, so a peak that moves from one phase to
another as L grows is still found. Proven against full traces in tests/test_simulate_extrapolate.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan, checkpointed_layers
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


def simulate(spec: ModelSpec, plan: Plan, *, layers: str | int = "auto", fake: bool = True,
             target_device: str = "cuda") -> Simulation:
    """Simulate one step of ``plan`` on ``spec``: ``layers`` = "auto" (extrapolate deep models), "full",
    or a number of layers to trace whole (a partial model, for tests)."""
    start = time.perf_counter()
    L = spec.num_layers
    if layers == "full" or (layers == "auto" and L <= FULL_UP_TO) or isinstance(layers, int):
        n = L if not isinstance(layers, int) or isinstance(layers, bool) else layers
        t = trace_step(spec, plan, fake=fake, num_layers=n, target_device=target_device)
        return Simulation(t.peak_bytes, t.peak_phase, t.ledger, t.phases, (n,), False,
                          time.perf_counter() - start, t.notes, ((n, t.events, t.event_layers),))
    if plan.gradient_checkpointing and 0 < len(checkpointed_layers(plan, L)) < L:
        return simulate_partial_checkpointing(spec, plan, fake=fake, target_device=target_device, start=start)
    n1, n2 = TRACE_LAYERS
    a = trace_step(spec, plan, fake=fake, num_layers=n1, target_device=target_device)
    b = trace_step(spec, plan, fake=fake, num_layers=n2, target_device=target_device)
    phases = extrapolate_phases(a, b, L)
    top = max(phases.values(), key=lambda p: p.bytes)
    return Simulation(top.bytes, top.phase, top.ledger, phases, (n1, n2), True, time.perf_counter() - start,
                      b.notes, ((n1, a.events, a.event_layers), (n2, b.events, b.event_layers)))


def extrapolate_phases(a: StepTrace, b: StepTrace, L: int) -> dict[str, PhasePeak]:
    k = (L - b.num_layers) / (b.num_layers - a.num_layers)
    out = {}
    for name in b.phases:
        if name not in a.phases:
            continue
        pa, pb = a.phases[name], b.phases[name]
        ledger = {c: max(0, round(pb.ledger[c] + k * (pb.ledger[c] - pa.ledger[c]))) for c in pb.ledger}
        host = max(0, round(pb.host_bytes + k * (pb.host_bytes - pa.host_bytes)))
        out[name] = PhasePeak(name, sum(ledger.values()), ledger, host_bytes=host)
    return out


def simulate_partial_checkpointing(spec: ModelSpec, plan: Plan, *, fake: bool, target_device: str,
                                   start: float) -> Simulation:
    """k of L layers checkpointed: memory is affine in the number of checkpointed layers c and of the others f,
    ``m(c, f) = m(1, 1) + (c - 1) * (m(2, 1) - m(1, 1)) + (f - 1) * (m(1, 2) - m(1, 1))``, from three traces with
    the checkpointed layers at the bottom (1+1, 2+1 and 1+2 layers). Proven against full traces in
    tests/test_simulate_extrapolate.py."""
    L = spec.num_layers
    c = len(checkpointed_layers(plan, L))
    f = L - c
    base = trace_step(spec, plan, fake=fake, num_layers=2, target_device=target_device, checkpoint_set=(0,))
    more_c = trace_step(spec, plan, fake=fake, num_layers=3, target_device=target_device, checkpoint_set=(0, 1))
    more_f = trace_step(spec, plan, fake=fake, num_layers=3, target_device=target_device, checkpoint_set=(0,))
    phases = {}
    for name in base.phases:
        if name not in more_c.phases or name not in more_f.phases:
            continue
        a, bc, bf = base.phases[name], more_c.phases[name], more_f.phases[name]

        def affine(va, vc, vf):
            return max(0, round(va + (c - 1) * (vc - va) + (f - 1) * (vf - va)))

        ledger = {k: affine(a.ledger[k], bc.ledger[k], bf.ledger[k]) for k in a.ledger}
        phases[name] = PhasePeak(name, sum(ledger.values()), ledger,
                                 host_bytes=affine(a.host_bytes, bc.host_bytes, bf.host_bytes))
    top = max(phases.values(), key=lambda p: p.bytes)
    return Simulation(top.bytes, top.phase, top.ledger, phases, (2, 3, 3), True, time.perf_counter() - start,
                      base.notes + [f"checkpointed {c} of {L} layers: traced 1+1, 2+1 and 1+2 (checkpointed + "
                                    "other) layers, extended affinely"])
