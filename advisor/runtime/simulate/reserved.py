"""The reserved memory of a simulated step: its allocations replayed through the caching-allocator model.

The tracker records every storage a traced step allocates and frees, in order
(``tracker.allocator_events``); ``advisor.memory.allocator.replay`` turns that sequence into what
``torch.cuda.max_memory_reserved`` would show. A deep model is traced at two depths and
extrapolated (extrapolate.py); the allocator is not linear in the depth (segments are shared,
cached blocks are reused or not), so the full-depth sequence is rebuilt instead: the events the
deeper trace has beyond the shallower one are one decoder layer's (``difflib`` finds them), and
each such run is repeated once per missing layer, with fresh ids (``deepen_events``).

Checked against full-depth traces (tests/test_simulate_reserved.py; measured while building it):
Qwen2.5-7B QLoRA + checkpointing, seq 1024, rebuilt from 2 and 3 layers vs traced with 28:
reserved 8546 vs 8582 MiB (-0.4%), with expandable segments 8102 vs 8112 MiB (-0.1%);
Qwen2.5-0.5B LoRA seq 1024 x 2: +0.9%; QLoRA seq 2048: -0.1%. Full fine-tuning with foreach
AdamW is where the rebuild falls short (its list ops hold every layer's temporaries at once and the
alignment does not repeat them all): the rebuilt live peak then misses the simulation's tensor peak
and ``step_reserved`` falls back to the traced ratio (0.5B, seq 512: +3.3% against the full trace).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Sequence

from advisor.memory.allocator import AllocatorConfig, AllocatorReplay, replay

REBUILD_TOLERANCE = 0.01   # the rebuilt sequence's live peak within 1% of the simulation's tensor peak


@dataclass(frozen=True)
class StepReserved:
    """Predicted reserved memory of one step at the model's full depth."""

    reserved_peak_bytes: int
    """Predicted ``torch.cuda.max_memory_reserved`` over the warm-up and the measured step."""
    fragmentation_bytes: int
    """Reserved peak minus the peak of live tensor bytes in the same replay (what the allocator holds beyond them)."""
    replay: AllocatorReplay
    """The replay of the (rebuilt) full-depth sequence."""
    rebuilt_from: tuple[int, ...]
    """Depths traced: one (replayed as traced) or two (full depth rebuilt from them)."""
    seconds: float = 0.0
    """Wall time of rebuilding and replaying (what the allocator model adds to a simulation)."""
    method: str = "replayed"
    """How the fragmentation was obtained: the replay itself, or (when the rebuilt sequence's live peak
    missed the simulation's tensor peak) the larger of it and the traced depth's reserved/live ratio."""


def _tokens(events: Sequence[tuple]) -> list[tuple[int, int]]:
    """An event as its kind and size (ids differ between traces; the sizes and their order do not)."""
    size_of: dict = {}
    out = []
    for kind, uid, n in events:
        if kind == "alloc":
            size_of[uid] = n
            out.append((0, n))
        else:
            out.append((1, size_of.get(uid, 0)))
    return out


def deepen_events(short: Sequence[tuple], long: Sequence[tuple], extra: int) -> list[tuple]:
    """The event sequence of a model ``extra`` layers deeper than the one that gave ``long``.

    ``short`` and ``long`` are traces of the same step one decoder layer apart. The runs of ``long``
    that ``short`` lacks (inserted, or the surplus of a replaced run) are one layer's allocations and
    frees in each part of the step (its weights, forward, recomputation, backward, optimizer update);
    each is followed by ``extra`` copies of itself. A copy's ids are ``(uid, k)``: a storage made in
    a repeated run is freed by the same copy's free, or, when its free lies outside the repeated
    runs, all copies are freed there; frees in a repeated run of storages made elsewhere are not
    repeated.
    """
    if extra <= 0:
        return list(long)
    ops = SequenceMatcher(None, _tokens(short), _tokens(long), autojunk=False).get_opcodes()
    repeated = [False] * len(long)
    for tag, i1, i2, j1, j2 in ops:
        if tag == "insert":
            first = j1
        elif tag == "replace" and j2 - j1 > i2 - i1:
            first = j2 - ((j2 - j1) - (i2 - i1))
        else:
            continue
        for j in range(first, j2):
            repeated[j] = True
    made_in_repeated = {long[j][1] for j in range(len(long)) if repeated[j] and long[j][0] == "alloc"}
    out: list[tuple] = []
    j, n = 0, len(long)
    copies = range(1, extra + 1)
    while j < n:
        if not repeated[j]:
            kind, uid, _ = long[j]
            out.append(long[j])
            if kind == "free" and uid in made_in_repeated:
                out.extend(("free", (uid, k), 0) for k in copies)
            j += 1
            continue
        end = j
        while end < n and repeated[end]:
            end += 1
        run = long[j:end]
        out.extend(run)
        for k in copies:
            for kind, uid, size in run:
                if kind == "alloc":
                    out.append(("alloc", (uid, k), size))
                elif kind == "free" and uid in made_in_repeated:
                    out.append(("free", (uid, k), 0))
        j = end
    return out


def step_reserved(traced: Sequence[tuple[int, Sequence[tuple]]], num_layers: int,
                  config: AllocatorConfig | None = None, *, tensor_peak_bytes: int | None = None) -> StepReserved:
    """Replay a traced step at ``num_layers`` decoder layers: ``traced`` is one (depth, events) pair
    traced at that depth, or two pairs one layer apart to rebuild the full depth from.

    ``tensor_peak_bytes``: the simulation's own (extrapolated) tensor peak. When the rebuilt
    sequence's live peak is more than ``REBUILD_TOLERANCE`` away from it, the rebuild missed part of
    the step (seen on full fine-tuning with foreach AdamW, whose list ops the alignment splits
    badly); the fragmentation is then the larger of the rebuilt one and the deeper trace's own
    reserved/live ratio applied to the tensor peak, so it errs high, never low.
    """
    start = time.perf_counter()
    config = config or AllocatorConfig()
    if len(traced) == 1 or traced[-1][0] == num_layers:
        depth, events = traced[-1]
        events = list(events)
        depths: tuple[int, ...] = (depth,)
    else:
        (d1, e1), (d2, e2) = traced[0], traced[1]
        if d2 - d1 != 1:
            raise ValueError(f"step_reserved: the two traces must be one layer apart, got {d1} and {d2}")
        events = deepen_events(e1, e2, num_layers - d2)
        depths = (d1, d2)
    r = replay(events, config)
    frag, method = r.reserved_peak_bytes - r.requested_peak_bytes, "replayed"
    if (len(depths) == 2 and tensor_peak_bytes
            and abs(r.requested_peak_bytes - tensor_peak_bytes) > REBUILD_TOLERANCE * tensor_peak_bytes):
        own = replay(list(traced[1][1]), config)
        ratio = own.reserved_peak_bytes / own.requested_peak_bytes if own.requested_peak_bytes else 1.0
        frag = max(frag, int((ratio - 1) * tensor_peak_bytes))
        method = (f"replayed; the rebuilt sequence's live peak is {r.requested_peak_bytes / tensor_peak_bytes - 1:+.1%} "
                  f"off the tensor peak, so at least the {depths[1]}-layer trace's reserved/live ratio "
                  f"({ratio:.3f}) is used")
    return StepReserved(reserved_peak_bytes=r.reserved_peak_bytes, fragmentation_bytes=frag,
                        replay=r, rebuilt_from=depths, seconds=time.perf_counter() - start, method=method)
