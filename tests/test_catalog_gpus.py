"""Every GPU catalog entry loads and is plausible; detection degrades to None without a GPU."""

from __future__ import annotations

import pytest

from advisor.core.catalog import detect_gpu, gpu_catalog, gpu_for_budget, resolve_gpu
from advisor.core.errors import AdvisorInputError

REQUIRED = ["rtx-3090", "rtx-4090", "rtx-5090", "t4", "v100-16gb", "a10g", "l4", "l40s", "a100-40gb", "a100-80gb",
            "h100-sxm", "h100-pcie", "h200"]


def test_required_gpus_present():
    assert set(REQUIRED) <= set(gpu_catalog())


@pytest.mark.parametrize("key", list(gpu_catalog()))
def test_entry_is_complete_and_plausible(key):
    g = resolve_gpu(key)
    assert 8 * 2**30 <= g.memory_bytes <= 200 * 2**30
    assert g.fp16_tflops > 0 and g.mem_bw_gbs > 0 and g.host_link_gbs > 0 and g.source
    assert (g.bf16_tflops is not None) == g.bf16


def test_resolve_by_alias_and_nvml_name():
    assert resolve_gpu("4090").key == "rtx-4090"
    assert resolve_gpu("NVIDIA GeForce RTX 4090").key == "rtx-4090"


def test_unknown_gpu():
    with pytest.raises(AdvisorInputError, match="--gpu"):
        resolve_gpu("rtx-9999")


def test_gpu_for_budget_never_below_budget():
    g = gpu_for_budget(24 * 2**30)
    assert g.memory_bytes >= 0.95 * 24 * 2**30


def test_detect_gpu_without_gpu_returns_none_or_spec():
    g = detect_gpu()
    assert g is None or g.detected
