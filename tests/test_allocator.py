"""The caching-allocator model against sequences worked out by hand from c10/cuda/CUDACachingAllocator.cpp."""

from __future__ import annotations

import random
import time

import pytest

from advisor.core.errors import AdvisorInputError
from advisor.memory.allocator import (AllocatorConfig, CachingAllocator, allocation_size, replay, round_size)

MiB = 1 << 20


def a(uid, nbytes):
    return ("alloc", uid, int(nbytes))


def f(uid):
    return ("free", uid, 0)


# ---------------------------------------------------------------- sizes


def test_round_size_512_byte_blocks():
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(3 * MiB + 1) == 3 * MiB + 512


def test_roundup_power2_divisions():
    # 5000 lies between 4096 and 8192; four divisions: 4096, 5120, 6144, 7168 -> 5120
    assert round_size(5000, 4) == 5120
    assert round_size(MiB + 1, 4) == MiB + MiB // 4
    assert round_size(4096, 4) == 4096          # a power of two stays
    assert round_size(1200, 4) == 1536          # at most 512 * divisions: plain 512-byte rounding


def test_segment_sizes():
    assert allocation_size(512) == 2 * MiB            # small requests: 2 MiB buffer
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB     # 1-10 MiB: a 20 MiB segment
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB      # 10 MiB and above: rounded to 2 MiB
    assert allocation_size(11 * MiB + 1) == 12 * MiB


# ---------------------------------------------------------------- reuse and splitting


def test_mid_size_request_gets_a_20mib_segment_and_its_remainder_is_reused():
    r = replay([a(1, 1.5 * MiB), a(2, 1.5 * MiB), a(3, 6 * MiB)])
    assert r.reserved_peak_bytes == 20 * MiB        # one segment serves all three (9 MiB)
    assert r.allocated_peak_bytes == 9 * MiB
    assert r.segments_peak == 1
    # freeing everything merges the segment back into one 20 MiB block: an 18 MiB request fits in it
    r = replay([a(1, 1.5 * MiB), a(2, 1.5 * MiB), f(1), f(2), a(3, 18 * MiB)])
    assert r.reserved_peak_bytes == 20 * MiB


def test_small_requests_pack_into_2mib_segments():
    r = replay([a(i, 4096) for i in range(1000)])
    assert r.reserved_peak_bytes == 4 * MiB        # 512 blocks of 4 KiB per 2 MiB segment -> 2 segments
    assert r.allocated_peak_bytes == 1000 * 4096


def test_split_blocks_fragment_until_a_new_segment_is_needed():
    # A, B, C of 6 MiB share one 20 MiB segment (2 MiB left); free A and C: free pieces of 6 and 8 MiB,
    # so a 12 MiB request needs its own 12 MiB segment
    ev = [a("A", 6 * MiB), a("B", 6 * MiB), a("C", 6 * MiB), f("A"), f("C"), a("D", 12 * MiB)]
    r = replay(ev)
    assert r.reserved_peak_bytes == 32 * MiB
    assert r.allocated_peak_bytes == 18 * MiB
    assert r.fragmentation_bytes == 14 * MiB


def test_large_remainder_of_one_mib_or_less_is_not_split():
    # a 12 MiB segment reused for 11.5 MiB: the 0.5 MiB rest stays in the block (counted as allocated)
    r = replay([a(1, 12 * MiB), f(1), a(2, 11.5 * MiB)])
    assert r.reserved_peak_bytes == 12 * MiB
    assert r.allocated_peak_bytes == 12 * MiB


def test_best_fit_takes_the_smallest_block_that_fits():
    alloc = CachingAllocator()
    big, small = alloc.malloc(40 * MiB), alloc.malloc(12 * MiB)
    alloc.free(big)
    alloc.free(small)
    b = alloc.malloc(11 * MiB)            # fits both; the 12 MiB block is the best fit
    assert b.size == 12 * MiB             # the 1 MiB rest is not split off (remaining must exceed 1 MiB)
    assert alloc.reserved == 52 * MiB


# ---------------------------------------------------------------- max_split_size_mb


def test_oversize_block_is_not_split_for_a_small_request():
    ev = [a(1, 100 * MiB), f(1), a(2, 10 * MiB)]
    assert replay(ev).reserved_peak_bytes == 100 * MiB                     # default: split the cached block
    r = replay(ev, AllocatorConfig(max_split_size_mb=64))
    assert r.reserved_peak_bytes == 110 * MiB                               # 100 MiB block left whole


def test_oversize_block_serves_a_large_request_within_20mib():
    cfg = AllocatorConfig(max_split_size_mb=64)
    r = replay([a(1, 100 * MiB), f(1), a(2, 90 * MiB)], cfg)
    assert r.reserved_peak_bytes == 100 * MiB and r.allocated_peak_bytes == 100 * MiB   # whole block, unsplit
    r = replay([a(1, 100 * MiB), f(1), a(2, 70 * MiB)], cfg)
    assert r.reserved_peak_bytes == 170 * MiB      # 100 >= 70 + 20: not used


def test_release_available_cached_blocks_frees_an_oversize_block_at_the_limit():
    cfg = AllocatorConfig(max_split_size_mb=64, limit_bytes=150 * MiB)
    r = replay([a(1, 100 * MiB), f(1), a(2, 70 * MiB)], cfg)
    assert r.oom_at_event is None
    assert r.reserved_peak_bytes == 100 * MiB     # the 100 MiB block was released before the 70 MiB cudaMalloc


# ---------------------------------------------------------------- out of memory, retries, garbage collection


def test_release_cached_blocks_and_retry_before_out_of_memory():
    cfg = AllocatorConfig(limit_bytes=40 * MiB)
    r = replay([a(1, 12 * MiB), f(1), a(2, 30 * MiB)], cfg)
    assert r.oom_at_event is None and r.alloc_retries == 1
    assert r.reserved_peak_bytes == 30 * MiB     # the cached 12 MiB segment went back to the driver first
    r = replay([a(1, 12 * MiB), a(2, 30 * MiB)], cfg)
    assert r.oom_at_event == 1                   # a live 12 MiB block cannot be released


def test_garbage_collection_frees_old_unsplit_blocks():
    ev = [a(1, 30 * MiB), f(1), a(2, 40 * MiB), f(2), a(3, 44 * MiB)]
    assert replay(ev, AllocatorConfig(limit_bytes=200 * MiB)).reserved_peak_bytes == 114 * MiB
    # threshold 0.3 x 200 MiB = 60 MiB < 70 MiB reserved: blocks at least the average age (1.5 calls) go;
    # the 30 MiB block (age 2) is freed, the 40 MiB one (age 1) stays
    r = replay(ev, AllocatorConfig(limit_bytes=200 * MiB, garbage_collection_threshold=0.3))
    assert r.reserved_peak_bytes == 84 * MiB


# ---------------------------------------------------------------- expandable segments


def test_expandable_segments_keep_reserved_close_to_allocated():
    ev = [a(i, 8 * MiB) for i in range(10)]
    assert replay(ev).reserved_peak_bytes == 100 * MiB     # two 8 MiB blocks per 20 MiB segment
    r = replay(ev, AllocatorConfig(expandable_segments=True))
    assert r.reserved_peak_bytes == 80 * MiB               # one segment, 20 MiB pages, packed tight
    assert r.allocated_peak_bytes == 80 * MiB


def test_expandable_segments_map_20mib_pages_for_large_and_2mib_for_small():
    cfg = AllocatorConfig(expandable_segments=True)
    assert replay([a(1, 1.5 * MiB)], cfg).reserved_peak_bytes == 20 * MiB
    assert replay([a(1, 4096)], cfg).reserved_peak_bytes == 2 * MiB
    assert replay([a(1, 21 * MiB)], cfg).reserved_peak_bytes == 40 * MiB


def test_expandable_segments_grow_from_a_free_tail():
    # A, B, C of 6 MiB in the first 20 MiB page; free A and C: C merges with the free 2 MiB tail, which
    # borders the unmapped space, so 12 MiB is served there by mapping one more page
    cfg = AllocatorConfig(expandable_segments=True)
    ev = [a("A", 6 * MiB), a("B", 6 * MiB), a("C", 6 * MiB), f("A"), f("C"), a("D", 12 * MiB), a("E", 6 * MiB)]
    r = replay(ev, cfg)
    assert r.reserved_peak_bytes == 40 * MiB
    assert r.allocated_peak_bytes == 24 * MiB   # E took A's old 6 MiB hole: no new page


def test_empty_cache_returns_every_free_page():
    for es in (False, True):
        alloc = CachingAllocator(AllocatorConfig(expandable_segments=es))
        blocks = [alloc.malloc(s) for s in (3 * MiB, 700_000, 25 * MiB, 4096)]
        for b in blocks:
            alloc.free(b)
        alloc.empty_cache()
        assert alloc.reserved == 0 and alloc.allocated == 0


# ---------------------------------------------------------------- replay, phases, config


def test_marks_give_each_phase_its_peaks():
    ev = [("mark", "load", 0), a(1, 30 * MiB), ("mark", "train", 0), a(2, 4 * MiB), f(2),
          ("mark", "eval", 0), a(3, 2 * MiB)]
    r = replay(ev)
    assert r.phases["load"].reserved_peak_bytes == 30 * MiB
    assert r.phases["train"].allocated_peak_bytes == 34 * MiB
    assert r.phases["train"].reserved_peak_bytes == 50 * MiB
    assert r.phases["eval"].reserved_peak_bytes == 50 * MiB   # the 20 MiB segment is cached and reused
    assert r.reserved_peak_bytes == 50 * MiB


def test_invariants_on_a_random_sequence():
    rng = random.Random(0)
    for es in (False, True):
        alloc = CachingAllocator(AllocatorConfig(expandable_segments=es))
        live = []
        for i in range(3000):
            if live and rng.random() < 0.45:
                alloc.free(live.pop(rng.randrange(len(live))))
            else:
                live.append(alloc.malloc(rng.choice([rng.randint(1, 4 * 1024) * 256, rng.randint(1, 60) * MiB // 3])))
            assert alloc.reserved >= alloc.allocated >= alloc.requested
        for b in live:
            alloc.free(b)
        alloc.empty_cache()
        assert alloc.reserved == 0


def test_alloc_conf_round_trip_and_errors():
    cfg = AllocatorConfig.from_env("expandable_segments:True, max_split_size_mb:128")
    assert cfg.expandable_segments and cfg.max_split_size_mb == 128
    assert AllocatorConfig.from_env(cfg.to_env()) == cfg
    assert AllocatorConfig().to_env() == ""
    with pytest.raises(AdvisorInputError, match="max_split_size_mb"):
        AllocatorConfig.from_env("max_split_size_mb:16")     # torch: "too small, must be > 20"
    with pytest.raises(AdvisorInputError, match="expandable_segments"):
        AllocatorConfig.from_env("expandable_segments:yes")


def test_replay_speed_tens_of_thousands_of_events():
    rng = random.Random(1)
    ev, live = [], []
    for i in range(60_000):
        if live and rng.random() < 0.5:
            ev.append(f(live.pop(rng.randrange(len(live)))))
        else:
            ev.append(a(i, rng.choice([rng.randint(1, 8000) * 512, rng.randint(1, 90) * MiB // 3])))
            live.append(i)
    t = time.perf_counter()
    replay(ev)
    assert time.perf_counter() - t < 2.0
