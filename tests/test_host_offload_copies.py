"""An activation offload without checkpointing copies a tensor each time an op saves it (TRL's OffloadActivations,
advisor.runtime.build.offload_hooks), one pinned power-of-two block per copy: the closed form's host count
(advisor.memory.training.offloaded_activation_blocks, with offload_copies) equals the simulation's, which makes
every copy under the same hooks, on tiny models here and on real-size ones (slow)."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.memory import experts
from advisor.memory.training import offloaded_activation_blocks, param_breakdown
from advisor.runtime.backends import get_backend
from advisor.runtime.simulate.tiny import tiny_spec
from matrix import matrix_params  # tests/matrix.py

METHODS = {
    "lora": dict(method="lora"),
    "qlora-nf4": dict(method="qlora", quantization="nf4"),
    "int8": dict(method="lora", quantization="int8"),
    "full": dict(method="full"),
}


def _plan(method: str, seq_len: int, **extra) -> Plan:
    kw = dict(METHODS[method], activation_offload=True, micro_batch=1, grad_accum=1, seq_len=seq_len,
              optimizer="adamw_8bit", loss="fused-linear", **extra)
    if method != "full":
        kw.update(lora_r=8, lora_targets="all-linear")
    return Plan(**kw)


def _host(spec, plan: Plan) -> tuple[int, int]:
    est = get_backend("estimate").measure(spec, plan, None).host_memory.pinned["activations"]
    sim = get_backend("simulate").measure(spec, plan, None).host_memory.pinned["activations"]
    return est, sim


# seq 64 > the tiny Gemma-3's and gpt-oss's window of 16: their sliding layers build an explicit mask
TINY_CASES = [("qwen2", "lora"), ("gemma3_text", "full"), ("qwen3_moe", "qlora-nf4"), ("gpt_oss", "lora"),
              pytest.param("llama", "int8", marks=pytest.mark.slow),
              pytest.param("qwen2", "full", marks=pytest.mark.slow),
              pytest.param("gemma3_text", "lora", marks=pytest.mark.slow),
              pytest.param("olmoe", "full", marks=pytest.mark.slow),
              pytest.param("deepseek_v2", "lora", marks=pytest.mark.slow)]


@pytest.mark.parametrize("model_type,method", TINY_CASES)
def test_tiny_models_host_copies_match_the_simulation(model_type, method):
    spec = tiny_spec(model_type, num_layers=2)
    est, sim = _host(spec, _plan(method, 64))
    assert est == pytest.approx(sim, rel=0.01), (model_type, method, est, sim)


def test_the_extra_copies_are_the_hosts_alone(monkeypatch):
    """The GPU holds each saved storage once: the copies an offload makes of a tensor saved twice change the host
    count, never the device ledger."""
    spec = tiny_spec("qwen2", num_layers=2)
    plan = _plan("lora", 64)
    pb = param_breakdown(spec, plan)
    assert experts.offload_copies(spec, plan, spec.description.layers[0], list(pb.lora_modules))
    with_copies = get_backend("estimate").measure(spec, plan, None)
    monkeypatch.setattr(experts, "offload_copies", lambda *a: [])
    without = get_backend("estimate").measure(spec, plan, None)
    assert with_copies.device == without.device and with_copies.peak_bytes == without.peak_bytes
    assert with_copies.host_memory.pinned["activations"] > without.host_memory.pinned["activations"] \
        == offloaded_activation_blocks(spec, plan, pb)


REAL = ["qwen2.5-0.5b-instruct", "llama-3.2-1b", "gemma-2-2b", "gemma-3-1b", "phi-3.5-mini",
        "qwen3-30b-a3b", "olmoe", "gpt-oss-20b", "deepseek-v2-lite"]


# every model and every method by default (each model once), the whole product with --full-matrix (tests/matrix.py)
@pytest.mark.slow
@pytest.mark.parametrize("model,method", matrix_params([(m, k) for m in REAL for k in METHODS],
                                                       lambda c: [("model", c[0]), ("method", c[1])],
                                                       ids=lambda c: f"{c[0]}-{c[1]}"))
def test_real_models_host_copies_match_the_simulation(model, method):
    est, sim = _host(resolve_model(model), _plan(method, 1024))
    assert est == pytest.approx(sim, rel=0.03), (model, method, est, sim)
