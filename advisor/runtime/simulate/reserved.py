"""The reserved memory of a simulated step: its allocations replayed through the caching-allocator model.

The tracker records every storage a traced step allocates and frees, in order
(``tracker.allocator_events``); ``advisor.memory.allocator.replay`` turns that sequence into what
``torch.cuda.max_memory_reserved`` would show. A deep model is traced at two depths and
extrapolated (extrapolate.py); the allocator is not linear in the depth (segments are shared,
cached blocks are reused or not), so the full-depth sequence is rebuilt instead. The runner tags
every event with the decoder layer it happened in (``runner.tag_layers``: forward pre-hooks and a
gradient hook on each layer's input; the optimizer's per-parameter ops inherit their parameter's
layer), and ``deepen_by_layer`` repeats the middle layer of the 3-layer trace once per missing layer.
Traces without tags fall back to aligning the 2- and 3-layer traces (``deepen_events``, difflib).

Checked against full-depth traces (measured while building it; tests/test_simulate_reserved.py
keeps 10-layer checks): Llama-2-7B LoRA q,v r8, 4 x 1024, checkpointing, 32 layers: live peak
exact, reserved 15.764 vs 15.764 GiB, 0.09 s (the alignment: live +19.6%, reserved +22.7%);
Qwen-7B LoRA r64 on every linear, 2048, checkpointing: live exact, reserved 21.33 vs 22.49 GiB
(-5.2%: some per-layer work of the backward falls outside the tags), 0.75 s (the alignment: +5.2%,
50 s). When the rebuilt live peak misses the simulation's tensor peak anyway (full fine-tuning
with a foreach optimizer whose list ops are not per layer), ``step_reserved`` falls back to the
traced ratio.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Sequence

from advisor.memory.allocator import AllocatorConfig, AllocatorReplay, replay

REBUILD_TOLERANCE = 0.01   # the rebuilt sequence's live peak within 1% of the simulation's tensor peak
MIDDLE_LAYER = 1           # the layer a 3-layer trace repeats: it has a neighbour on each side


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
    """Depths traced: the model's own (replayed as traced), or the one or two the full depth was rebuilt from."""
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


def deepen_by_layer(events: Sequence[tuple], layers: Sequence[int | None], layer: int, extra: int) -> list[tuple]:
    """The event sequence of a model ``extra`` layers deeper, from one trace whose events carry the
    decoder layer they happened in (``runner.tag_layers``): each run of ``layer``'s events (its
    weights, forward, recomputation, backward) is followed by ``extra`` copies of itself, fresh ids.
    ``deepen_by_layers`` with one layer."""
    return deepen_by_layers(events, layers, {layer: extra})


def deepen_by_layers(events: Sequence[tuple], layers: Sequence[int | None], extras: dict[int, int]) -> list[tuple]:
    """The event sequence of a deeper model, from one trace whose events carry the decoder layer they happened in
    (``runner.tag_layers``): each run of the events of a layer in ``extras`` (its weights, forward, recomputation,
    backward) is followed by ``extras[layer]`` copies of itself, fresh ids. Several layers are repeated at once
    for a model whose layers are of several kinds (one traced layer of each kind).

    Each repeated layer must have a neighbour on each side (a middle layer), so that what it hands on is what
    every copy hands on. In copy k a storage that the run makes and frees is copy k's own. A storage
    the layer hands to a neighbour (its output, its input's gradient) joins a first-in-first-out pool
    of its size; each free of a neighbour's storage in a copy, and the traced free of the handed
    storage itself, frees the oldest live one of the pool, the way layer i frees what layer i-1 handed
    it. Copies of other storages that outlive their run (gradients, optimizer states) are freed where
    the original is; storages made elsewhere (the loss, the optimizer) are freed once, as traced.
    Linear in the events.
    """
    extras = {layer: n for layer, n in extras.items() if n > 0}
    if not extras:
        return list(events)
    made_in: dict = {}
    freed_in: dict = {}
    size_of: dict = {}
    for (kind, uid, size), tag in zip(events, layers):
        if kind == "alloc":
            made_in[uid], size_of[uid] = tag, size
        else:
            freed_in[uid] = tag

    def neighbours(layer) -> set:
        return {layer - 1, layer + 1} if isinstance(layer, int) else set()

    handed = {uid for uid, tag in made_in.items() if tag in extras and freed_in.get(uid) in neighbours(tag)}
    out: list[tuple] = []
    pool: dict[int, deque] = defaultdict(deque)   # size -> handed storages (originals and copies), oldest first
    copies: dict = defaultdict(list)              # original uid -> its copies that outlive their run
    alive: set = set()

    def free(cid) -> None:
        alive.discard(cid)
        out.append(("free", cid, 0))

    def free_oldest_handed(size: int) -> None:
        queue = pool[size]
        while queue:
            cid = queue.popleft()
            if cid in alive:
                free(cid)
                return

    def emit(kind, uid, size, cid, layer) -> None:
        """The event of ``uid`` in the original run of ``layer`` (``cid`` = uid) or in a copy."""
        if kind == "alloc":
            out.append(("alloc", cid, size))
            alive.add(cid)
            if uid in handed:
                pool[size].append(cid)
            elif cid != uid and freed_in.get(uid, "never") != layer:
                copies[uid].append(cid)
        elif made_in.get(uid) == layer:
            if cid == uid or cid in alive:
                free(cid)
        elif made_in.get(uid) in neighbours(layer) and cid != uid:
            free_oldest_handed(size_of.get(uid, 0))
        elif cid == uid:
            out.append(("free", uid, 0))

    n, i = len(events), 0
    while i < n:
        kind, uid, size = events[i]
        layer = layers[i]
        if layer not in extras:
            if kind == "free" and uid in handed:
                free_oldest_handed(size_of[uid])
            else:
                out.append(events[i])
                if kind == "free":
                    for cid in copies.pop(uid, ()):
                        if cid in alive:
                            free(cid)
            i += 1
            continue
        j = i
        while j < n and layers[j] == layer:
            j += 1
        run = events[i:j]
        for kind, uid, size in run:
            emit(kind, uid, size, uid, layer)
        for k in range(1, extras[layer] + 1):
            for kind, uid, size in run:
                emit(kind, uid, size, (uid, k), layer)
        i = j
    return out


def step_reserved(traced: Sequence[tuple], num_layers: int,
                  config: AllocatorConfig | None = None, *, tensor_peak_bytes: int | None = None) -> StepReserved:
    """Replay a traced step at ``num_layers`` decoder layers: ``traced`` is one (depth, events) pair
    traced at that depth, or two pairs one layer apart to rebuild the full depth from. When the
    deeper pair carries the layer of each event (depth, events, layers) and has a middle layer, the
    full depth is rebuilt from it alone by repeating that layer (``deepen_by_layer``); else the two
    traces are aligned (``deepen_events``). A model whose layers are of several kinds passes one
    (depth, events, layers, {middle layer: copies}) quadruple: each kind's middle layer is repeated
    (``deepen_by_layers``).

    ``tensor_peak_bytes``: the simulation's own (extrapolated) tensor peak. When the rebuilt
    sequence's live peak is more than ``REBUILD_TOLERANCE`` away from it, the rebuild missed part of
    the step (seen on full fine-tuning with foreach AdamW, whose list ops hold every layer's
    temporaries at once, outside any layer); the fragmentation is then the larger of the rebuilt one
    and the deeper trace's own reserved/live ratio applied to the tensor peak, so it errs high.
    """
    start = time.perf_counter()
    config = config or AllocatorConfig()
    depth, last_events = traced[-1][0], traced[-1][1]
    tags = traced[-1][2] if len(traced[-1]) > 2 else None
    depths: tuple[int, ...] = (depth,)
    if len(traced[-1]) > 3:
        events = deepen_by_layers(last_events, tags, traced[-1][3])
    elif depth == num_layers:
        events = list(last_events)
    elif tags and depth >= 3 and MIDDLE_LAYER in tags:
        events = deepen_by_layer(last_events, tags, MIDDLE_LAYER, num_layers - depth)
    elif len(traced) == 1:
        events = list(last_events)
    else:
        (d1, e1), (d2, e2) = traced[0][:2], traced[1][:2]
        if d2 - d1 != 1:
            raise ValueError(f"step_reserved: the two traces must be one layer apart, got {d1} and {d2}")
        events = deepen_events(e1, e2, num_layers - d2)
        depths = (d1, d2)
    r = replay(events, config)
    frag, method = r.reserved_peak_bytes - r.requested_peak_bytes, "replayed"
    if (depths[-1] != num_layers and tensor_peak_bytes
            and abs(r.requested_peak_bytes - tensor_peak_bytes) > REBUILD_TOLERANCE * tensor_peak_bytes):
        own = replay(list(last_events), config)
        ratio = own.reserved_peak_bytes / own.requested_peak_bytes if own.requested_peak_bytes else 1.0
        frag = max(frag, int((ratio - 1) * tensor_peak_bytes))
        method = (f"replayed; the rebuilt sequence's live peak is "
                  f"{r.requested_peak_bytes / tensor_peak_bytes - 1:+.1%} "
                  f"off the tensor peak, so at least the {depths[-1]}-layer trace's reserved/live ratio "
                  f"({ratio:.3f}) is used")
    return StepReserved(reserved_peak_bytes=r.reserved_peak_bytes, fragmentation_bytes=frag,
                        replay=r, rebuilt_from=depths, seconds=time.perf_counter() - start, method=method)
