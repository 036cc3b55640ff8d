"""Issue 42 item 14: the space's global_batch is the sequences of one optimizer step over the whole run, split over
its data-parallel ranks (was per GPU: --gpus 8 global_batch=64 trained 512), and the answer says it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from advisor.cli import main
from advisor.memory.sharding import data_parallel_ranks, global_batch
from advisor.search.space import load_space, plan_from_params


def _plan(gpus: int, **params):
    space = replace(load_space("default", ["global_batch=64"]), gpus=gpus)
    return plan_from_params({"method": "lora", **params}, space, {})


def test_the_global_batch_is_split_over_the_ranks():
    assert _plan(1, micro_batch=4).grad_accum == 16
    eight = _plan(8, micro_batch=4)
    assert eight.grad_accum == 2 and global_batch(8, eight) == 64
    # a sequence-parallel group of 2 GPUs is one rank: 4 ranks of 8 GPUs
    sp = _plan(8, micro_batch=4, sp_degree=2, attn_impl="sdpa")
    assert data_parallel_ranks(8, sp) == 4 and sp.grad_accum == 4 and global_batch(8, sp) == 64
    # more ranks x micro-batch than the global batch: one micro-batch each, the real global batch said
    many = _plan(32, micro_batch=4)
    assert many.grad_accum == 1 and global_batch(32, many) == 128


@pytest.mark.slow  # a 3-trial tune: 6 s
def test_tune_says_the_run_and_its_global_batch(tmp_path, capsys):
    code = main(["tune", "--model", "qwen0.5b", "--gpus", "4", "--gpu", "rtx-4090", "--gpu-budget", "24GB",
                 "--backend", "estimate", "--trials", "3", "--reports-dir", str(tmp_path), "--json",
                 "global_batch=32", "method=lora"])
    out = json.loads(capsys.readouterr().out)
    lay = out["layout"]
    assert code == 0 and lay["gpus"] == 4 and lay["sharding"] == "zero3" and lay["global_batch"] == 32
    plan = out["best"]["plan"]
    assert plan["micro_batch"] * plan["grad_accum"] * 4 == 32
    from advisor.ui.render import layout_lines

    assert layout_lines(out)[0].startswith("Run: 4 GPUs, zero3; a global batch of 32 sequences a step")
