"""Issue 42 items 9 and 10: a gradient reduction hides behind the backward that makes it, never more than that
backward's own time (DDP hid a fixed 70% of the all-reduce whatever the compute); the CPU optimizer of an offload
runs at one socket's rate shared by the node's ranks (eight ranks had a socket each)."""

from __future__ import annotations

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.speed.inputs import StepInputs
from advisor.speed.terms import backward_gemm_seconds, collectives, offload


def _inputs(seq_len: int) -> StepInputs:
    plan = Plan(method="full", micro_batch=1, seq_len=seq_len, grad_accum=1, optimizer="adamw_torch")
    return StepInputs(resolve_model("qwen1.5b"), plan, resolve_gpu("rtx-4090"), 4, "ddp")


def test_a_short_backward_hides_only_its_own_time():
    s = _inputs(512)
    all_reduce = 0.75 * 2 * s.pb.trainable * s.trainable_bytes / s.interconnect  # ring, 4 GPUs
    backward = backward_gemm_seconds(s)
    assert backward < 0.3 * all_reduce  # 1.5B full over PCIe: the all-reduce dwarfs a 512-token backward
    assert abs(collectives(s) - (all_reduce - backward)) < 1e-9


def test_a_long_backward_hides_ddps_share():
    s = _inputs(32768)
    all_reduce = 0.75 * 2 * s.pb.trainable * s.trainable_bytes / s.interconnect
    assert backward_gemm_seconds(s) > all_reduce
    assert abs(collectives(s) - s.k["comm_exposed"]["ddp"] * all_reduce) < 1e-9


def test_the_ranks_of_a_node_share_its_sockets_cpu_adam():
    plan = Plan(method="full", gradient_checkpointing=True, optimizer="adamw_torch", offload="zero3_cpu")
    model, gpu = resolve_model("llama70b"), resolve_gpu("h100-sxm")
    eight, two = StepInputs(model, plan, gpu, 8, "zero3"), StepInputs(model, plan, gpu, 2, "zero3")
    rate = eight.k["cpu_adam_params_per_s"]
    adam8 = eight.pb.trainable / 8 / (rate * 2 / 8)  # 2 sockets for 8 ranks
    adam2 = two.pb.trainable / 2 / rate  # a socket each
    links = lambda s, shards: (offload(s) - s.pb.trainable / shards / (rate * min(s.gpus, 2) / s.gpus))  # noqa: E731
    assert links(eight, 8) > 0 and links(two, 2) > 0
    assert abs(offload(eight) - links(eight, 8) - adam8) < 1e-6 and abs(offload(two) - links(two, 2) - adam2) < 1e-6
    assert adam8 == 4 * (eight.pb.trainable / 8 / rate)
