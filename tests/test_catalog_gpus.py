"""Every GPU catalog entry loads and is plausible; detection degrades to None without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from advisor.core.catalog import detect_gpu, gpu_catalog, gpu_for_budget, resolve_gpu
from advisor.core.errors import AdvisorInputError

REQUIRED = ["rtx-3090", "rtx-4090", "rtx-5090", "t4", "v100-16gb", "a10g", "l4", "l40s", "a100-40gb", "a100-80gb",
            "h100-sxm", "h100-pcie", "h200", "h800", "h20", "b200", "rtx-pro-6000"]


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


class FakeNvml:
    """An honest stand-in for pynvml: the devices it is given, and the calls it was asked (init/shutdown paired)."""

    def __init__(self, devices=(), init_error: Exception | None = None):
        self.devices = list(devices)  # (name, total bytes)
        self.init_error = init_error
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, handle):
        return self.devices[handle][0].encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=self.devices[handle][1])


def _with_nvml(monkeypatch, fake):
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_detect_gpu_reads_a_catalogued_gpu_from_nvml(monkeypatch):
    fake = _with_nvml(monkeypatch, FakeNvml([("NVIDIA GeForce RTX 3090", 25_769_803_776),
                                             ("NVIDIA GeForce RTX 4090", 25_757_220_864)]))
    g = detect_gpu(1)
    assert g.key == "rtx-4090" and g.detected and g.index == 1
    assert g.memory_bytes == 25_757_220_864, "the memory NVML reports, not the catalog's"
    assert g.bf16_tflops == resolve_gpu("rtx-4090").bf16_tflops
    assert fake.calls == ["init", "shutdown"]


def test_detect_gpu_outside_the_catalog_keeps_its_name_and_memory(monkeypatch):
    _with_nvml(monkeypatch, FakeNvml([("NVIDIA RTX PRO 9999", 100 * 2**30)]))
    g = detect_gpu()
    assert g.key == "detected" and g.name == "NVIDIA RTX PRO 9999" and g.memory_bytes == 100 * 2**30
    assert g.detected and g.bf16_tflops is None and "not in the catalog" in g.source


def test_detect_gpu_is_none_without_a_driver_or_a_device(monkeypatch):
    fake = _with_nvml(monkeypatch, FakeNvml(init_error=RuntimeError("NVML Shared Library Not Found")))
    assert detect_gpu() is None and fake.calls == ["init"]
    fake = _with_nvml(monkeypatch, FakeNvml([("NVIDIA H200", 150 * 10**9)]))
    assert detect_gpu(1) is None and fake.calls == ["init", "shutdown"]  # index past the last device
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert detect_gpu() is None


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
def test_detect_gpu_on_this_machine_without_a_gpu_is_none():
    assert detect_gpu() is None
