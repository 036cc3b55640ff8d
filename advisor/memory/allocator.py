"""A model of PyTorch's CUDA caching allocator: replay allocations and frees, read reserved memory.

A training run dies on ``torch.cuda.max_memory_reserved`` (the segments the caching allocator holds
from the driver), not on the live bytes. This module replays an ordered sequence of allocations
and frees through the allocator's rules and returns the reserved peak, the allocated peak and the
memory held beyond the live blocks. Pure Python (no torch): the simulation records the events on
fake tensors, and this replays them.

Source followed, function by function (names in the comments below are the C++ ones):
pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``, read at commit
001074d25084) and ``c10/cuda/CUDAAllocatorConfig.cpp`` (``parseMaxSplitSize``,
``parseGarbageCollectionThreshold``). What is modelled:

- ``round_size``: requests rounded up to 512 B (``kMinBlockSize``), or to the next power-of-two
  division with ``roundup_power2_divisions`` (the single-number form);
- ``get_pool``: requests of at most 1 MiB (``kSmallSize``) in the small pool, the rest in the large;
- ``get_allocation_size``: a new segment is 2 MiB (``kSmallBuffer``) for small requests, 20 MiB
  (``kLargeBuffer``) for requests under 10 MiB (``kMinLargeAlloc``), else the request rounded up
  to 2 MiB (``kRoundLarge``);
- ``get_free_block``: best fit (the smallest cached block that fits, then the lowest address); with
  ``max_split_size_mb`` a request below it never takes an oversize block and a request above it
  takes a block at most 20 MiB larger;
- ``should_split`` / ``alloc_found_block``: the rest of a block is split off when it is at least
  512 B (small pool, expandable segments) or more than 1 MiB (large pool, request below
  ``max_split_size``); ``free_block`` / ``try_merge_blocks``: a freed block merges with free
  neighbours of its segment;
- ``alloc_block`` with the retries of ``malloc``: ``release_available_cached_blocks`` (oversize
  blocks), then ``release_cached_blocks`` (every unsplit cached segment), when a limit is set;
- ``garbage_collect_cached_blocks``: with ``garbage_collection_threshold`` and a memory fraction
  set (the only case in which torch runs it), unsplit blocks older than the average are freed;
- ``expandable_segments``: one segment per pool (one stream) whose physical memory is mapped in
  pages of 2 MiB (small pool) or 20 MiB (large pool) as it grows (``find_expandable_block``,
  ``map_block``, ``try_allocate_expandable_block``, ``unmap_block``); blocks split at 512 B.

Not modelled: several streams (the advisor's step runs on one), CUDA graph private pools,
``recordStream`` events, the per-interval form of ``roundup_power2_divisions``, and
``max_non_split_rounding_mb`` (newer torch; its default equals the 20 MiB used here).
"""

from __future__ import annotations

import time
from bisect import bisect_left, insort
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from advisor.core.errors import AdvisorInputError

MIB = 1 << 20
K_MIN_BLOCK_SIZE = 512           # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB           # kSmallSize: largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 * MIB         # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_MIN_LARGE_ALLOC = 10 * MIB     # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 * MIB          # kRoundLarge: round up large allocations to 2 MiB
K_LARGE_BUFFER = 20 * MIB        # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
NO_LIMIT = (1 << 64) - 1         # CUDAAllocatorConfig::max_split_size() default: numeric_limits<size_t>::max()
ADDRESS_SPACE = 1 << 40          # virtual address space of one expandable segment (torch: 1.125 x GPU memory)

Event = tuple  # ("alloc", uid, nbytes) | ("free", uid, 0) | ("mark", phase name, 0)


class AllocatorOutOfMemory(RuntimeError):
    """The replay could not serve a request within ``AllocatorConfig.limit_bytes`` after every retry."""


# ---------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class AllocatorConfig:
    """The settings of PYTORCH_CUDA_ALLOC_CONF that change memory, and the memory limit."""

    expandable_segments: bool = False
    """One growing segment per pool, mapped page by page (``expandable_segments:True``)."""
    max_split_size_mb: int | None = None
    """Blocks of at least this many MiB are never split (``max_split_size_mb``; > 20); None: no limit."""
    roundup_power2_divisions: int = 0
    """Round requests up to one of this many divisions between powers of two (0 or 1: off)."""
    garbage_collection_threshold: float = 0.0
    """Fraction of ``limit_bytes`` above which old unsplit cached blocks are freed (0: off)."""
    limit_bytes: int | None = None
    """Most bytes the allocator may reserve (``set_per_process_memory_fraction`` x GPU memory); None: no limit."""

    @property
    def max_split_size(self) -> int:
        return NO_LIMIT if self.max_split_size_mb is None else int(self.max_split_size_mb) * MIB

    def validate(self) -> "AllocatorConfig":
        # CUDAAllocatorConfig::parseMaxSplitSize: "max_split_size_mb too small, must be > 20"
        if self.max_split_size_mb is not None and not (isinstance(self.max_split_size_mb, int)
                                                       and self.max_split_size_mb > K_LARGE_BUFFER // MIB):
            raise AdvisorInputError("max_split_size_mb", f"must be a whole number of MiB above "
                                    f"{K_LARGE_BUFFER // MIB}", self.max_split_size_mb)
        # parseGarbageCollectionThreshold: "set it 0.0~1.0" (0 < t < 1; 0 here means off)
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise AdvisorInputError("garbage_collection_threshold", "must be in [0, 1)",
                                    self.garbage_collection_threshold)
        d = self.roundup_power2_divisions
        if not isinstance(d, int) or d < 0 or (d > 1 and d & (d - 1)):
            raise AdvisorInputError("roundup_power2_divisions", "must be 0 or a power of two", d)
        return self

    @classmethod
    def from_env(cls, text: str | None, **overrides: Any) -> "AllocatorConfig":
        """Parse a PYTORCH_CUDA_ALLOC_CONF string (``key:value,key:value``)."""
        values: dict[str, Any] = {}
        for item in (text or "").split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, raw = item.partition(":")
            key, raw = key.strip(), raw.strip()
            if not sep:
                raise AdvisorInputError("PYTORCH_CUDA_ALLOC_CONF", "each setting is key:value", item)
            try:
                if key == "expandable_segments":
                    if raw not in ("True", "False"):
                        raise ValueError
                    values[key] = raw == "True"
                elif key == "max_split_size_mb":
                    values[key] = int(raw)
                elif key == "roundup_power2_divisions":
                    values[key] = int(raw)
                elif key == "garbage_collection_threshold":
                    values[key] = float(raw)
                # other keys (backend, pinned_*, release_lock_on_cudamalloc...) do not change the device memory
            except ValueError:
                raise AdvisorInputError(f"PYTORCH_CUDA_ALLOC_CONF {key}", "has a value torch would reject",
                                        raw) from None
        values.update(overrides)
        return cls(**values).validate()

    def to_env(self) -> str:
        """The PYTORCH_CUDA_ALLOC_CONF string that sets these options (empty for the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size_mb is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_mb}")
        if self.roundup_power2_divisions > 1:
            parts.append(f"roundup_power2_divisions:{self.roundup_power2_divisions}")
        if self.garbage_collection_threshold > 0:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        return ",".join(parts)


# ---------------------------------------------------------------------------------------------- blocks


class _Segment:
    """An expandable segment (``ExpandableSegment``): a virtual range mapped in pages."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int):
        self.base, self.page, self.size = base, page, size


class _Block:
    """``Block``: a piece of a segment, free or allocated; ``prev``/``next`` are its neighbours."""

    __slots__ = ("size", "addr", "allocated", "prev", "next", "pool", "segment", "mapped", "gc_base")

    def __init__(self, size: int, addr: int, pool: "_Pool", segment: _Segment | None = None, mapped: bool = True):
        self.size = size
        self.addr = addr
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.pool = pool
        self.segment = segment
        self.mapped = mapped
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """``BlockPool``: free mapped blocks ordered by (size, address), unmapped ones by address."""

    __slots__ = ("is_small", "keys", "by_addr", "unmapped_keys", "unmapped", "calls")

    def __init__(self, is_small: bool):
        self.is_small = is_small
        self.keys: list[tuple[int, int]] = []     # BlockComparatorSize (one stream)
        self.by_addr: dict[int, _Block] = {}
        self.unmapped_keys: list[int] = []        # BlockComparatorAddress
        self.unmapped: dict[int, _Block] = {}
        self.calls = 0                            # get_free_blocks_call_count

    def insert(self, b: _Block) -> None:  # insert_into_blocks
        b.gc_base = self.calls
        insort(self.keys, (b.size, b.addr))
        self.by_addr[b.addr] = b

    def erase(self, b: _Block) -> None:
        i = bisect_left(self.keys, (b.size, b.addr))
        del self.keys[i]
        del self.by_addr[b.addr]

    def insert_unmapped(self, b: _Block) -> None:
        insort(self.unmapped_keys, b.addr)
        self.unmapped[b.addr] = b

    def erase_unmapped(self, b: _Block) -> None:
        del self.unmapped_keys[bisect_left(self.unmapped_keys, b.addr)]
        del self.unmapped[b.addr]


# ---------------------------------------------------------------------------------------------- allocator


class CachingAllocator:
    """``DeviceCachingAllocator`` for one device and one stream, without CUDA: sizes and addresses only."""

    def __init__(self, config: AllocatorConfig | None = None):
        self.config = (config or AllocatorConfig()).validate()
        self._max_split = self.config.max_split_size
        self._gc_on = self.config.garbage_collection_threshold > 0 and self.config.limit_bytes is not None
        self.small = _Pool(True)
        self.large = _Pool(False)
        self._next_addr = 1 << 30
        self.allocated = 0
        self.reserved = 0
        self.requested = 0
        self.segments = 0
        self.allocated_peak = 0
        self.reserved_peak = 0
        self.requested_peak = 0
        self.unused_at_reserved_peak = 0
        self.segments_peak = 0
        self.alloc_retries = 0
        self.ooms = 0
        self._requested_of: dict[int, int] = {}

    # ------------------------------------------------------------------ public

    def malloc(self, orig_size: int) -> _Block:
        """``DeviceCachingAllocator::malloc``: the block that serves a request of ``orig_size`` bytes."""
        size = round_size(orig_size, self.config.roundup_power2_divisions)
        pool = self.small if size <= K_SMALL_SIZE else self.large   # get_pool
        alloc_size = allocation_size(size)
        block = self._get_free_block(pool, size)
        if block is None:
            if self._gc_on:
                self._garbage_collect_cached_blocks()
            block = (self._alloc_block(pool, size, alloc_size)
                     or (self._release_available_cached_blocks(pool, size)
                         and self._alloc_block(pool, size, alloc_size))
                     or (self._release_cached_blocks() and self._alloc_block(pool, size, alloc_size, retry=True)))
        if not block:
            self.ooms += 1
            raise AllocatorOutOfMemory(
                f"CUDA out of memory (predicted): tried to allocate {alloc_size} B with {self.reserved} B reserved, "
                f"{self.allocated} B allocated, limit {self.config.limit_bytes} B")
        block = self._alloc_found_block(block, size, self._should_split(block, size))
        self._requested_of[block.addr] = orig_size
        self.requested += orig_size
        if self.requested > self.requested_peak:
            self.requested_peak = self.requested
        return block

    def free(self, block: _Block) -> None:
        """``DeviceCachingAllocator::free``: the block goes back to its pool (merged with free neighbours)."""
        block.allocated = False
        self.allocated -= block.size
        self.requested -= self._requested_of.pop(block.addr, 0)
        self._free_block(block)

    def empty_cache(self) -> None:
        """``emptyCache``: every unsplit cached segment back to the driver."""
        self._release_cached_blocks()

    def set_limit(self, limit_bytes: int | None) -> None:
        """``setMemoryFraction`` (torch.cuda.set_per_process_memory_fraction): the most bytes reserved from now on."""
        self.config = replace(self.config, limit_bytes=limit_bytes)
        self._gc_on = self.config.garbage_collection_threshold > 0 and limit_bytes is not None

    def reset_peak(self) -> None:
        """``resetPeakStats``."""
        self.allocated_peak = self.allocated
        self.reserved_peak = self.reserved
        self.requested_peak = self.requested
        self.unused_at_reserved_peak = self.reserved - self.allocated
        self.segments_peak = self.segments

    # ------------------------------------------------------------------ allocation path

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        if self._gc_on:
            pool.calls += 1   # track block reuse interval only when garbage collection is enabled
        keys = pool.keys
        i = bisect_left(keys, (size, -1))
        if i == len(keys):
            return None
        b = pool.by_addr[keys[i][1]]
        if b.segment is not None:
            # expandable: a block followed by unmapped space counts as the size it can grow to, so a
            # strictly tighter block further on is preferred
            def expandable_size(x: _Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)
            while b.segment is not None and i + 1 < len(keys):
                nb = pool.by_addr[keys[i + 1][1]]
                if expandable_size(nb) < expandable_size(b):
                    i, b = i + 1, nb
                else:
                    break
        # do not return an oversized block for a large request
        if size < self._max_split and b.size >= self._max_split:
            return None
        # allow an oversized block to be rounded up, but within a limit
        if size >= self._max_split and b.size >= size + K_LARGE_BUFFER:
            return None
        pool.erase(b)
        return b

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, block: _Block, size: int, split: bool) -> _Block:
        if split:
            remaining = block
            block = _Block(size, remaining.addr, remaining.pool, remaining.segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            remaining.pool.insert(remaining)
        block.allocated = True
        self.allocated += block.size
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        if self.reserved == self.reserved_peak and self.reserved - self.allocated < self.unused_at_reserved_peak:
            self.unused_at_reserved_peak = self.reserved - self.allocated   # the least held unused at the peak
        return block

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, retry: bool = False) -> _Block | None:
        if retry:
            self.alloc_retries += 1
        limit = self.config.limit_bytes
        if limit is not None and self.reserved + alloc_size > limit:   # set_fraction check
            return None
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, size)
        block = _Block(alloc_size, self._next_addr, pool)   # cudaMalloc
        self._next_addr += alloc_size + K_ROUND_LARGE
        self.segments += 1
        self._grow(alloc_size)
        return block

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved
            self.unused_at_reserved_peak = self.reserved - self.allocated
        if self.segments > self.segments_peak:
            self.segments_peak = self.segments

    # ------------------------------------------------------------------ freeing

    def _free_block(self, block: _Block) -> None:
        pool = block.pool
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert(block)

    @staticmethod
    def _try_merge_blocks(dst: _Block, src: _Block | None, pool: _Pool) -> int:
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:   # [src dst]
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:                 # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _release_block(self, block: _Block) -> None:   # cudaFree of a whole unsplit segment
        assert block.segment is None and not block.is_split()
        block.pool.erase(block)
        self.reserved -= block.size
        self.segments -= 1

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """Free oversize cached blocks, only enough to serve the request (needs max_split_size_mb)."""
        if self._max_split == NO_LIMIT:
            return False
        key = max(size, self._max_split)
        keys = pool.keys
        i = bisect_left(keys, (key, -1))
        if i == len(keys):
            # no single block is large enough: free oversize blocks, starting with the largest
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < key and i >= 0 and keys[i][0] >= self._max_split:
                b = pool.by_addr[keys[i][1]]
                released += b.size
                self._release_block(b)
                i -= 1
            return released >= key
        self._release_block(pool.by_addr[keys[i][1]])
        return True

    def _release_cached_blocks(self) -> bool:
        for pool in (self.large, self.small):   # release_blocks: every non-split block
            to_unmap = []
            for _, addr in list(pool.keys):
                b = pool.by_addr[addr]
                if b.segment is not None:
                    to_unmap.append(b)
                elif not b.is_split():
                    self._release_block(b)
            for b in to_unmap:
                self._unmap_block(b)
        return True

    def _garbage_collect_cached_blocks(self) -> None:
        limit = self.config.limit_bytes or 0
        threshold = int(self.config.garbage_collection_threshold * limit)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self.large
        freeable = [b for b in (pool.by_addr[a] for _, a in pool.keys) if not b.is_split() and b.segment is None]
        if not freeable:
            return
        total_age = sum(pool.calls - b.gc_base for b in freeable)
        count = len(freeable)
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for _, a in list(pool.keys):
                b = pool.by_addr.get(a)
                if b is None or b.is_split() or b.segment is not None:
                    continue
                age = pool.calls - b.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    # ------------------------------------------------------------------ expandable segments

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        def allocatable(b: _Block | None) -> bool:
            return b is not None and not b.allocated

        def room(b: _Block | None) -> bool:
            n = 0
            while n < size and allocatable(b):
                n += b.size
                b = b.next
            return n >= size

        for addr in pool.unmapped_keys:   # the lowest address first
            c = pool.unmapped[addr]
            if allocatable(c.prev):
                c = c.prev
            if room(c):
                return c
        page = K_SMALL_BUFFER if pool.is_small else K_LARGE_BUFFER   # 2 MiB pages small, 20 MiB large
        seg = _Segment(self._next_addr, page, ADDRESS_SPACE)
        self._next_addr += ADDRESS_SPACE
        candidate = _Block(seg.size, seg.base, pool, seg, mapped=False)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, to_map: _Block, size: int) -> bool:
        seg = to_map.segment
        begin = (to_map.addr - seg.base) // seg.page
        end = -(-(to_map.addr + size - seg.base) // seg.page)
        mapped = (end - begin) * seg.page
        pool = to_map.pool
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = _Block(to_map.size - mapped, to_map.addr + mapped, pool, seg, mapped=False)
            rest.prev, rest.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            pool.insert_unmapped(rest)
            to_map.size = mapped
        self._try_merge_blocks(to_map, to_map.prev, pool)
        self._try_merge_blocks(to_map, to_map.next, pool)
        pool.insert(to_map)
        self._grow(mapped)
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block | None:
        c = self._find_expandable_block(pool, size)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nc = c.next
            if not self._map_block(nc, min(size - c.size, nc.size)):
                return None
            c = nc
        pool.erase(c)
        return c

    def _unmap_block(self, block: _Block) -> None:
        seg = block.segment
        begin = -(-(block.addr - seg.base) // seg.page)
        end = (block.addr + block.size - seg.base) // seg.page
        if begin >= end:
            return
        pool = block.pool
        pool.erase(block)
        start, nbytes = seg.base + begin * seg.page, (end - begin) * seg.page
        before = start - block.addr
        if before > 0:
            b = _Block(before, block.addr, pool, seg)
            b.prev, b.next = block.prev, block
            if block.prev is not None:
                block.prev.next = b
            block.prev = b
            pool.insert(b)
        after = block.size - before - nbytes
        if after > 0:
            a = _Block(after, start + nbytes, pool, seg)
            a.prev, a.next = block, block.next
            if block.next is not None:
                block.next.prev = a
            block.next = a
            pool.insert(a)
        block.addr, block.size, block.mapped = start, nbytes, False
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self.reserved -= nbytes


# ---------------------------------------------------------------------------------------------- sizes


def round_size(size: int, divisions: int = 0) -> int:
    """``round_size``: a request rounded as the allocator rounds it."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return _roundup_power2_next_division(size, divisions)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: 1200 with 4 divisions -> 1280 (1024, 1280, 1536, 1792)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def allocation_size(size: int) -> int:
    """``get_allocation_size``: bytes of the segment a new request of ``size`` (rounded) gets."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


# ---------------------------------------------------------------------------------------------- replay


@dataclass(frozen=True)
class MarkedPeaks:
    """Peaks between two marks of a replay (``torch.cuda.reset_peak_memory_stats`` at each mark)."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int


@dataclass(frozen=True)
class AllocatorReplay:
    """What the caching allocator would hold over a sequence of allocations and frees (predicted)."""

    reserved_peak_bytes: int
    """Predicted ``torch.cuda.max_memory_reserved``: segments held from the driver at the worst moment."""
    allocated_peak_bytes: int
    """Predicted ``torch.cuda.max_memory_allocated``: blocks handed out (rounded sizes, unsplit remainders)."""
    requested_peak_bytes: int
    """Peak of the bytes requested (before rounding): the live tensor bytes."""
    fragmentation_bytes: int
    """reserved_peak_bytes - allocated_peak_bytes: what the allocator holds beyond the live blocks."""
    unused_at_reserved_peak_bytes: int
    """Reserved minus allocated while reserved memory stood at its peak (the least of it)."""
    segments_peak: int
    """Most segments held at once (cudaMalloc'd segments; expandable segments are not counted)."""
    events: int
    """Allocations and frees replayed."""
    seconds: float
    """Wall time of the replay."""
    oom_at_event: int | None = None
    """Index of the event that could not be served within the limit (None: no out-of-memory)."""
    alloc_retries: int = 0
    """Allocations that had to free every cached segment and retry (``num_alloc_retries``)."""
    phases: dict[str, MarkedPeaks] = field(default_factory=dict)
    """Peaks between ``mark`` events, by the mark's name."""
    config: AllocatorConfig = field(default_factory=AllocatorConfig)

    def to_dict(self) -> dict[str, Any]:
        return {"reserved_peak_bytes": self.reserved_peak_bytes, "allocated_peak_bytes": self.allocated_peak_bytes,
                "requested_peak_bytes": self.requested_peak_bytes, "fragmentation_bytes": self.fragmentation_bytes,
                "unused_at_reserved_peak_bytes": self.unused_at_reserved_peak_bytes,
                "segments_peak": self.segments_peak, "events": self.events, "seconds": round(self.seconds, 4),
                "oom_at_event": self.oom_at_event, "alloc_retries": self.alloc_retries,
                "phases": {k: {"allocated_peak_bytes": v.allocated_peak_bytes,
                               "reserved_peak_bytes": v.reserved_peak_bytes} for k, v in self.phases.items()},
                "alloc_conf": self.config.to_env()}


def replay(events: Iterable[Event], config: AllocatorConfig | None = None, *,
           allocator: CachingAllocator | None = None) -> AllocatorReplay:
    """Replay ``events`` in order: ``("alloc", uid, nbytes)``, ``("free", uid, 0)``, ``("mark", name, 0)``.

    A zero-byte allocation takes no block (torch returns a null pointer for it); a free of an uid
    never allocated is ignored. Pass ``allocator`` to continue from an earlier replay's state (a
    run's phases one after another); its peaks are reset first. Stops at the first allocation
    that cannot be served within ``config.limit_bytes``.
    """
    start = time.perf_counter()
    a = allocator if allocator is not None else CachingAllocator(config)
    a.reset_peak()
    live: dict[Any, _Block] = {}
    phases: dict[str, MarkedPeaks] = {}
    phase: str | None = None
    n = 0
    oom_at = None
    malloc, free = a.malloc, a.free

    def close(name: str | None) -> None:
        if name is not None:
            prev = phases.get(name)
            now = MarkedPeaks(a.allocated_peak, a.reserved_peak)
            if prev is not None:
                now = MarkedPeaks(max(prev.allocated_peak_bytes, now.allocated_peak_bytes),
                                  max(prev.reserved_peak_bytes, now.reserved_peak_bytes))
            phases[name] = now

    overall = [0, 0, 0, 0, 0]  # allocated, reserved, requested peaks, unused at reserved peak, segments
    def fold() -> None:
        overall[0] = max(overall[0], a.allocated_peak)
        if a.reserved_peak > overall[1]:
            overall[1] = a.reserved_peak
            overall[3] = a.unused_at_reserved_peak
        overall[2] = max(overall[2], a.requested_peak)
        overall[4] = max(overall[4], a.segments_peak)

    for kind, key, nbytes in events:
        if kind == "alloc":
            n += 1
            if nbytes <= 0:
                continue
            try:
                live[key] = malloc(nbytes)
            except AllocatorOutOfMemory:
                oom_at = n - 1
                break
        elif kind == "free":
            n += 1
            b = live.pop(key, None)
            if b is not None:
                free(b)
        elif kind == "mark":
            fold()
            close(phase)
            a.reset_peak()
            phase = key
        else:
            raise ValueError(f"replay: unknown event kind {kind!r} (alloc, free or mark)")
    fold()
    close(phase)
    return AllocatorReplay(
        reserved_peak_bytes=overall[1], allocated_peak_bytes=overall[0], requested_peak_bytes=overall[2],
        fragmentation_bytes=overall[1] - overall[0], unused_at_reserved_peak_bytes=overall[3],
        segments_peak=overall[4], events=n, seconds=time.perf_counter() - start, oom_at_event=oom_at,
        alloc_retries=a.alloc_retries, phases=phases, config=a.config)
