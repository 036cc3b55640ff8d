"""`benchmarks/gpu_validation.py --device cpu --tiny`: the CI form of the GPU validation, for real."""

from __future__ import annotations

import pytest

from benchmark_modules import load_benchmark  # tests/benchmark_modules.py


@pytest.mark.slow
def test_gpu_validation_tiny_cpu_writes_the_report(tmp_path):
    mod = load_benchmark("gpu_validation")
    out = tmp_path / "gpu_validation.md"
    rc = mod.main(["--device", "cpu", "--tiny", "--out", str(out), "--timeout", "240", "--limit", "2"])
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| tiny-")]
    assert rc == 0 and len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "ok" and cells[3].endswith("MiB")
        assert "%" in cells[8]  # the analytic error was computed against a measured peak
        from advisor.runtime.backends import available

        if "simulate" in available():
            err = float(cells[6].split("(")[1].rstrip("%)"))
            assert abs(err) <= 2.0  # same step, same counting: within 2%


def test_the_pressure_section_squeezes_the_largest_reserved_gap():
    """On a GPU the benchmark reruns the probe whose reserved - allocated gap is largest under budgets that take
    half and 90% of that gap away; the table gives each step time against the unconstrained one."""
    from advisor.core.plan import Plan
    from advisor.runtime.probe import ProbeResult

    mod = load_benchmark("gpu_validation")
    GiB = 2**30

    def probe(alloc, reserved, nvml, ms, retries=0, status="ok"):
        return ProbeResult(status=status, message="", device="cuda", model="m", plan={}, steps=2, warmup=1,
                           peak_allocated_bytes=int(alloc * GiB), peak_reserved_bytes=int(reserved * GiB),
                           nvml_peak_bytes=int(nvml * GiB), step_time_median_s=ms / 1e3, tokens_per_s=1e6 / ms,
                           alloc_retries=retries)

    small = mod.Row("m", Plan(method="lora"), probe=probe(4, 4.1, 4.6, 100))
    wide = mod.Row("m", Plan(method="full"), probe=probe(10, 12, 12.5, 200))
    squeezes = mod.pressure_runs([small, wide])
    assert [q.row for q in squeezes] == [wide, wide]
    assert [q.budget for q in squeezes] == [int(11.5 * GiB), int(10.7 * GiB)]
    assert mod.pressure_runs([small]) == []  # a 100 MiB gap leaves nothing to squeeze
    squeezes[0].probe = probe(10, 11, 11.5, 260, retries=12)
    table = "\n".join(mod.pressure_table(squeezes, device="cuda"))
    assert "| 11.50 GiB | 50% | ok | 260 (+30.0%) |" in table and "| 12 |" in table
    assert "skipped (time)" in table  # the second budget never ran
    assert "CUDA only" in "\n".join(mod.pressure_table([], device="cpu"))


def test_the_long_loss_probe_is_qwens_8192_token_lora_on_the_15b_model():
    """On a GPU one more probe: Qwen's LoRA profile at 8192 tokens on the model with Qwen-1's vocabulary, where the
    published figures and the replayed fragmentation disagree; none on the tiny CPU run or on the other models."""
    mod = load_benchmark("gpu_validation")
    from advisor.core.catalog import resolve_model

    (plan,) = mod.long_loss_plans("qwen2.5-1.5b-instruct", tiny=False)
    plan.validate()
    assert plan.seq_len == 8192 and plan.lora_r == 64 and plan.gradient_checkpointing
    assert resolve_model("qwen2.5-1.5b-instruct").vocab_size == 151936
    assert mod.long_loss_plans("qwen2.5-1.5b-instruct", tiny=True) == []
    assert mod.long_loss_plans("qwen2.5-7b-instruct", tiny=False) == []
