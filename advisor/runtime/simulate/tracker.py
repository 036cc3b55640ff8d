"""The live-bytes tracker: every storage a step allocates, when it is freed, and the peak.

A ``TorchDispatchMode`` sees each op's outputs; a new untyped storage is recorded with its size
and a weak-reference callback records its release (the pattern of
``torch.distributed._tools.mem_tracker``, without its module hooks, which break on peft models).
The same tracker runs over fake tensors (simulation) and real CPU tensors (the proof that the
simulation equals execution). Sizes are rounded up to 512 bytes, as CUDA's caching allocator
counts them (c10/cuda/CUDACachingAllocator.cpp ``kMinBlockSize``, ``round_size``); host copies (an activation
offload's) to the power-of-two block of torch's pinned CachingHostAllocator (advisor.memory.host).

Events are kept (allocation and release counters), so the ledger at the peak is computed after
the step, when it is known which storages are parameters, gradients, optimizer states, quantization
constants or saved activations.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from advisor.memory.host import pinned_block_bytes

BLOCK = 512


def round_block(n: int, block: int = BLOCK) -> int:
    return ((n + block - 1) // block) * block if n > 0 else 0


@dataclass
class Record:
    uid: int
    nbytes: int
    born: int
    phase: str
    died: int | None = None
    op: str = ""
    """The op that allocated it (for explaining a peak)."""
    requested: int = 0
    """The storage's own nbytes, before the 512-byte rounding (what the CUDA allocator is asked for)."""
    host: bool = False
    """Allocated in host memory (an offloaded activation), outside the device count."""
    layer: int | None = None
    """The decoder layer whose forward, recomputation or backward was running when it was made (runner.py tags)."""
    died_layer: int | None = None
    """The same when it was freed."""
    part: str | None = None
    """The part of a vision-language model it belongs to (vision_tower, projector; advisor.runtime.simulate.vision)."""


@dataclass
class Peak:
    bytes: int = 0
    clock: int = 0
    phase: str = ""


def _make_mode_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        """Counts the bytes of live storages; ``peak`` is the highest count since ``reset_peak``."""

        def __init__(self, block: int = BLOCK):
            super().__init__()
            self.block = block
            self.clock = 0
            self.live_bytes = 0
            self.records: list[Record] = []
            self.by_id: dict[int, Record] = {}
            self._refs: dict[int, weakref.ref] = {}
            self.phase = "build"
            self.layer: int | None = None
            self.part: str | None = None
            self.peak = Peak()
            self.paused = 0
            self.phantoms = PHANTOMS
            self.host_bytes = 0
            self.host_peak = 0
            self.host_peak_clock = 0
            self._on_host = 0

        # -------------------------------------------------------------- bookkeeping

        def _tick(self) -> int:
            self.clock += 1
            return self.clock

        def _alloc(self, nbytes: int) -> Record:
            on_host = self._on_host > 0
            # an offload's host copies are pinned: torch's CachingHostAllocator gives each a power-of-two block
            size = pinned_block_bytes(nbytes) if on_host else round_block(nbytes, self.block)
            rec = Record(uid=len(self.records), nbytes=size, born=self._tick(),
                         phase=self.phase, requested=int(nbytes), host=on_host, layer=self.layer,
                         part=self.part)
            self.records.append(rec)
            if rec.host:
                self.host_bytes += rec.nbytes
                if self.host_bytes > self.host_peak:
                    self.host_peak, self.host_peak_clock = self.host_bytes, rec.born
                return rec
            self.live_bytes += rec.nbytes
            if self.live_bytes > self.peak.bytes:
                self.peak = Peak(self.live_bytes, rec.born, self.phase)
            return rec

        def _free(self, rec: Record) -> None:
            if rec.died is None:
                rec.died = self._tick()
                rec.died_layer = self.layer
                if rec.host:
                    self.host_bytes -= rec.nbytes
                else:
                    self.live_bytes -= rec.nbytes

        def track(self, t, op: str = "") -> None:
            """Record ``t``'s storage if it is new (also used for tensors made outside the mode)."""
            if not isinstance(t, torch.Tensor) or t.device.type == "meta" or is_traceable_wrapper_subclass(t):
                # a wrapper subclass (torchao's quantized optimizer states) owns no storage of its own:
                # its inner tensors are allocated, and tracked, by the ops that make them
                return
            st = t.untyped_storage()
            key = id(st)
            if key in self.by_id and self._refs[key]() is st:
                return
            rec = self._alloc(st.nbytes())
            rec.op = op
            self.by_id[key] = rec

            def released(_ref, key=key, rec=rec, self_ref=weakref.ref(self)):
                me = self_ref()
                if me is None:
                    return
                me._free(rec)
                if me.by_id.get(key) is rec:
                    del me.by_id[key]
                    del me._refs[key]

            self._refs[key] = weakref.ref(st, released)

        def record_of(self, t) -> Record | None:
            """The live record of ``t``'s storage."""
            if not isinstance(t, torch.Tensor):
                return None
            st = t.untyped_storage()
            rec = self.by_id.get(id(st))
            return rec if rec is not None and self._refs[id(st)]() is st else None

        def reset_peak(self) -> None:
            self.peak = Peak(self.live_bytes, self.clock, self.phase)

        def live_at(self, clock: int) -> list[Record]:
            return [r for r in self.records if r.born <= clock and (r.died is None or r.died > clock) and not r.host]

        def host_live_at(self, clock: int) -> list[Record]:
            return [r for r in self.records if r.born <= clock and (r.died is None or r.died > clock) and r.host]

        def on_host(self):
            """Allocations made inside this context live in host memory (an offload's copies)."""
            import contextlib

            @contextlib.contextmanager
            def ctx():
                self._on_host += 1
                try:
                    yield
                finally:
                    self._on_host -= 1

            return ctx()

        def allocator_events(self, start: int = 0, end: int | None = None, layers: bool = False):
            """This tracker's allocations and frees, in order, for advisor.memory.allocator.replay."""
            return allocator_events(self.records, start, end, layers)

        # -------------------------------------------------------------- dispatch

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._local_scalar_dense.default and _is_fake(args[0]):
                return _data_dependent_scalar(args[0])
            name = func.name()
            phantom = self.phantoms.get(name) if not self.paused else None
            extra = self._alloc(phantom(args, kwargs)) if phantom else None
            if extra is not None:
                extra.op = name + " (inside)"
            out = func(*args, **kwargs)
            if extra is not None:
                self._free(extra)
            if not self.paused:
                self._track_outputs(out, args, name)
            return out

        def _layer_of(self, t) -> int | None:
            rec = self.record_of(t)
            return rec.layer if rec is not None else None

        def _track_outputs(self, out, args, name: str) -> None:
            """Record an op's outputs. Outside the layers, a foreach op (the optimizer step, gradient
            clipping) makes one output per input tensor, each tagged with that input's layer (a
            parameter's, its gradient's or state's); in the optimizer step any other op's output is
            its first tensor input's layer's."""
            outs = tree_flatten(out)[0]
            if self.layer is not None:
                for t in outs:
                    self.track(t, name)
                return
            inputs = args[0] if args and isinstance(args[0], (list, tuple)) else ()
            if name.startswith("aten::_foreach") and isinstance(out, (list, tuple)):
                layers = [self._layer_of(inputs[i]) if i < len(inputs) else None for i in range(len(outs))]
            elif self.phase == "optimizer":
                first = next((a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)), None)
                layers = [self._layer_of(first)] * len(outs)
            else:
                layers = [None] * len(outs)
            for t, layer in zip(outs, layers):
                self.layer = layer
                self.track(t, name)
            self.layer = None

    return LiveBytes


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _data_dependent_scalar(t):
    """A fake tensor has no values, so ``.item()`` / ``.tolist()`` / ``bool()`` cannot be answered; some
    optimizers read one to steer control flow, not memory (APOLLO's next projection seed and its norm-growth
    limiter, apollo_torch/random_projector.py next_seed). Answer 1 (True for bools): every branch they take
    allocates the same tensors, which the fake-vs-real tests prove on the CPU. A tensor with real values beside it
    (a vision-language model's image grid and placeholder ids: advisor.runtime.simulate.vision_shadow) answers
    its own value."""
    import torch

    from advisor.runtime.simulate.vision_shadow import shadow_of

    if shadow_of(t) is not None:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return shadow_of(t).item()

    if t.dtype is torch.bool:
        return True
    return 1.0 if t.dtype.is_floating_point or t.dtype.is_complex else 1


def _gemm_4bit_dequant(args, kwargs) -> int:
    """bitsandbytes::gemm_4bit dequantizes the whole weight before ``F.linear`` inside the op on the
    fallback path CUDA takes for training shapes (bitsandbytes/backends/cuda/ops.py
    ``_dequant_linear_fallback``, M > 1536 rows or the heuristic); count it for the op's duration."""
    A, shape_b = args[0], args[2]
    return int(shape_b[0]) * int(shape_b[1]) * A.element_size()


# ops that allocate inside a single dispatched op what no output shows: op name -> bytes
PHANTOMS = {"bitsandbytes::gemm_4bit": _gemm_4bit_dequant}

_CLS = None


def LiveBytes(block: int = BLOCK):
    """A new tracker (the class is made on first use, so that importing this module imports no torch)."""
    global _CLS
    if _CLS is None:
        _CLS = _make_mode_class()
    return _CLS(block)


def allocator_events(records: list[Record], start: int = 0, end: int | None = None, layers: bool = False):
    """The allocations and frees the CUDA caching allocator would see, in the order they happened.

    Each storage is one request of its own nbytes (``Record.requested``; the allocator rounds it).
    The storages already live at clock ``start`` come first, in the order they were made, as if the
    run had allocated them fresh with nothing else in between (the caching that building the model
    on the CPU caused is not the GPU run's); then every allocation and free after ``start`` up to
    ``end``. Zero-byte storages are left out (the allocator gives them no block).

    ``layers``: also return, for each event, the decoder layer it happened in (None outside the
    layers; a layer's weights and optimizer states are its own), for ``reserved.deepen_by_layer``.
    """
    ordered: list[tuple[int, int, str, int, int, int | None]] = []
    for r in records:
        size = r.requested or r.nbytes
        if size <= 0 or (end is not None and r.born > end) or r.host:
            continue  # (host memory, an offload's copies, is not the GPU allocator's)
        if r.died is not None and r.died <= start:
            continue
        ordered.append((r.born if r.born > start else -1, r.uid, "alloc", r.uid, size, r.layer))
        if r.died is not None and (end is None or r.died <= end):
            ordered.append((r.died, r.uid, "free", r.uid, 0, r.died_layer))
    ordered.sort(key=lambda e: e[:2])
    events = [(kind, uid, size) for _, _, kind, uid, size, _ in ordered]
    return (events, [e[5] for e in ordered]) if layers else events
