"""The CUDA test double: a cuda-like device whose work runs on the CPU, so the GPU path runs without a GPU.

After PyTorch's fake process group (torch.testing._internal.distributed.fake_pg; STYLE.md 15): the code
under test keeps every one of its cuda branches, and only what only a GPU can answer is answered here,
behind advisor.runtime.cuda_boundary. It is switched on by ``ADVISOR_CUDA_DOUBLE=<catalog GPU>``
(read in one place, advisor.core.catalog.cuda_double_gpu), which every child process inherits: GPU
detection then answers that catalog GPU, and a probe asked for ``device="cuda"`` runs its real training
step on the CPU, reports ``device: cuda`` and answers the cuda-only readings from what the CPU run did:

==========================================  =====================================================================
on a GPU                                    under the double
==========================================  =====================================================================
is_available, get_device_name, properties   True; the catalog GPU's name + " (cuda test double)"; its memory
tensors on "cuda"                           on the CPU, built with CUDA's choices (build's ``target_device``)
synchronize                                 nothing to wait for: a CPU op is done when it returns
memory_allocated, max_memory_allocated      every tensor storage made since the double started (the live-bytes
                                            tracker of the CPU probe and the simulation), served by the model of
                                            the caching allocator (advisor.memory.allocator) as it happens
memory_reserved, max_memory_reserved,       that allocator model's segments, retries and cache
num_alloc_retries, empty_cache
set_per_process_memory_fraction             a real cap: RLIMIT_DATA at what the process holds + the fraction of
                                            the GPU's memory (advisor.runtime.probe._limits.limit_cpu, the CPU
                                            probe's), and the allocator model's limit; going over is a real
                                            out-of-memory (status oom)
NVML process memory (usedGpuMemory)         reserved + CONTEXT_BYTES, a fixed CUDA context, from the first
                                            tensor on the device (before it, no context: NVML lists no process)
NVML driver version                         DRIVER ("cuda test double"): nothing measured through it passes for a
                                            GPU's
cuBLAS workspace                            none: the matmuls run on the CPU (a calibration measures 0)
==========================================  =====================================================================

Every result made through it says so: the GPU's name ends with " (cuda test double)" (so calibration
entries never mix with a real GPU's), a probe's ``test_double`` names the catalog GPU, and its notes and
memory method say that the step ran on the CPU. Step times are the CPU's.

The double counts the tensors made in the thread that started it (the probe's training thread), from its
start: in a child process, the first question asked through the boundary; in a test, ``use()``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from types import SimpleNamespace
from typing import Any, Iterator

from advisor.core.catalog import CUDA_DOUBLE_ENV, MIB, GpuSpec, cuda_double_gpu

CONTEXT_BYTES = 600 * MIB
"""The CUDA context the double's NVML adds to reserved memory: the top of the 300-600 MiB seen on fresh
processes (advisor/data/overheads.yaml, cuda_context_mib), apart from that file's 500 MiB prior so that a
test can tell a calibrated figure from the prior."""
DRIVER = "cuda test double"
"""What the double's NVML gives as the driver version."""
METHOD = ("cuda test double: torch.cuda.max_memory_allocated of the caching-allocator model "
          "(advisor.memory.allocator), fed every storage the live-bytes tracker sees on real CPU tensors")
NVML_METHOD = f"cuda test double: NVML process memory = reserved + a fixed {CONTEXT_BYTES // MIB} MiB CUDA context"


class CudaDouble:
    """Stands in for ``torch.cuda`` (the calls the advisor makes) and, as ``.nvml``, for ``pynvml``."""

    def __init__(self, gpu: GpuSpec) -> None:
        from advisor.memory.allocator import AllocatorConfig, CachingAllocator

        self.gpu = gpu
        self.key = gpu.key
        """The catalog GPU it stands for (ProbeResult.test_double)."""
        self.allocator = CachingAllocator(AllocatorConfig.from_env(os.environ.get("PYTORCH_CUDA_ALLOC_CONF")))
        self.nvml = NvmlDouble(self)
        self.note = (f"ran on the CUDA test double ({CUDA_DOUBLE_ENV}={gpu.key}), not on a GPU: the step ran on the "
                     f"CPU; allocated and reserved are its storages through the caching-allocator model, NVML is "
                     f"reserved + a fixed {CONTEXT_BYTES // MIB} MiB context, step times are the CPU's")
        self.method = METHOD
        """How allocated memory is measured (ProbeResult.memory_method)."""
        self.nvml_method = NVML_METHOD
        """How NVML's process memory is answered."""
        self.limits: dict[str, int] = {}
        self.context_bytes = 0
        """The CUDA context: CONTEXT_BYTES from the first device allocation on, as CUDA creates it lazily."""
        self._tracker = _feeding_tracker(self.allocator, self._create_context)
        self._tracker.__enter__()

    def _create_context(self) -> None:
        self.context_bytes = CONTEXT_BYTES

    def stop(self) -> None:
        """Stop counting (the tracker leaves the dispatch-mode stack of the thread that started it)."""
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self._tracker = None

    # ---------------------------------------------------------------- torch.cuda

    def is_available(self) -> bool:
        return True

    def get_device_name(self, device: Any = None) -> str:
        return self.gpu.name

    def get_device_properties(self, device: Any = None) -> Any:
        return SimpleNamespace(name=self.gpu.name, total_memory=int(self.gpu.memory_bytes))

    def synchronize(self, device: Any = None) -> None:
        """Nothing to wait for: a CPU op has finished when it returns."""

    def empty_cache(self) -> None:
        self._tracker_call(self.allocator.empty_cache)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self._tracker_call(self.allocator.reset_peak)

    def memory_allocated(self, device: Any = None) -> int:
        return int(self.allocator.allocated)

    def max_memory_allocated(self, device: Any = None) -> int:
        return int(self.allocator.allocated_peak)

    def memory_reserved(self, device: Any = None) -> int:
        return int(self.allocator.reserved)

    def max_memory_reserved(self, device: Any = None) -> int:
        return int(self.allocator.reserved_peak)

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        a = self.allocator
        return {"allocated_bytes.all.current": a.allocated, "allocated_bytes.all.peak": a.allocated_peak,
                "reserved_bytes.all.current": a.reserved, "reserved_bytes.all.peak": a.reserved_peak,
                "num_alloc_retries": a.alloc_retries, "num_ooms": a.ooms}

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        total = int(self.gpu.memory_bytes)
        return max(0, total - self.nvml.process_bytes()), total

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        """The cap, for real: RLIMIT_DATA on this process (the CPU probe's limit) and the allocator model's limit."""
        from advisor.runtime.probe._limits import limit_cpu

        cap = int(fraction * self.gpu.memory_bytes)
        self._tracker_call(self.allocator.set_limit, cap)
        self.limits = limit_cpu(cap)

    def _tracker_call(self, fn: Any, *args: Any) -> Any:
        if self._tracker is None:
            return fn(*args)
        return self._tracker.serve(fn, *args)


class NvmlDouble:
    """The pynvml calls the advisor makes, answered for the double's one GPU and this process."""

    def __init__(self, cuda: CudaDouble) -> None:
        self._cuda = cuda

    def process_bytes(self) -> int:
        return int(self._cuda.allocator.reserved) + self._cuda.context_bytes

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802
        if index != 0:
            raise ValueError(f"the CUDA test double holds one GPU (index 0), not index {index}")
        return "cuda-test-double:0"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:  # noqa: N802
        total, used = int(self._cuda.gpu.memory_bytes), self.process_bytes()
        return SimpleNamespace(total=total, used=used, free=max(0, total - used))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:  # noqa: N802
        if not self._cuda.context_bytes:
            return []  # a process without a CUDA context is not a compute process
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.process_bytes())]

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return DRIVER


def _feeding_tracker(allocator: Any, on_first: Any) -> Any:
    """The simulation's live-bytes tracker (advisor.runtime.simulate.tracker), each device storage it sees
    also asked of ``allocator`` (``malloc`` when made, ``free`` when released), as the caching allocator is;
    ``on_first()`` is called at the first one."""
    from advisor.runtime.simulate.tracker import LiveBytes

    base = type(LiveBytes())

    class Feeding(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self._blocks: dict[int, Any] = {}
            self._lock = threading.RLock()
            self._busy = False
            self._deferred: list[Any] = []

        def serve(self, fn: Any, *args: Any) -> Any:
            """Run one allocator-model call at a time. A storage released while one runs (the garbage
            collector can run inside it, on this thread) is freed right after it."""
            with self._lock:
                if self._busy:
                    if fn != allocator.free:
                        raise RuntimeError("the CUDA test double's allocator model was re-entered")
                    self._deferred.append(args[0])
                    return None
                self._busy = True
                try:
                    out = fn(*args)
                    while self._deferred:
                        allocator.free(self._deferred.pop())
                finally:
                    self._busy = False
                return out

        def _alloc(self, nbytes: int) -> Any:
            rec = super()._alloc(nbytes)
            if not rec.host and rec.requested > 0:
                if not self._blocks and on_first is not None:
                    on_first()
                try:
                    self._blocks[rec.uid] = self.serve(allocator.malloc, rec.requested)
                except Exception as e:  # AllocatorOutOfMemory: over the cap set_per_process_memory_fraction set
                    import torch

                    raise torch.OutOfMemoryError(f"CUDA out of memory (cuda test double): {e}") from None
            return rec

        def _free(self, rec: Any) -> None:
            super()._free(rec)
            block = self._blocks.pop(rec.uid, None)
            if block is not None:
                self.serve(allocator.free, block)

    return Feeding()


_ACTIVE: CudaDouble | None = None


def active() -> CudaDouble | None:
    """This process's double while ``$ADVISOR_CUDA_DOUBLE`` names a GPU (started on the first call), else None."""
    global _ACTIVE
    gpu = cuda_double_gpu()
    if gpu is None:
        return None
    if _ACTIVE is None or _ACTIVE.gpu != gpu:
        if _ACTIVE is not None:
            _ACTIVE.stop()
        _ACTIVE = CudaDouble(gpu)
    return _ACTIVE


def stop() -> None:
    """Stop this process's double, if one runs (``use`` does it on leaving)."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.stop()
        _ACTIVE = None


@contextlib.contextmanager
def use(gpu: str) -> Iterator[CudaDouble]:
    """Switch the double on in this process (and the children it starts) for the catalog GPU ``gpu``;
    it counts the tensors made inside the block, as a GPU counts those made after CUDA starts.

        with use("rtx-4090") as cuda:
            model = build()           # "on the GPU": counted
            trainer.train()           # MemoryGuardCallback reads cuda.max_memory_allocated()
    """
    before = os.environ.get(CUDA_DOUBLE_ENV)
    os.environ[CUDA_DOUBLE_ENV] = gpu
    try:
        stop()
        double = active()
        assert double is not None
        yield double
    finally:
        stop()
        if before is None:
            os.environ.pop(CUDA_DOUBLE_ENV, None)
        else:
            os.environ[CUDA_DOUBLE_ENV] = before


__all__ = ["CONTEXT_BYTES", "DRIVER", "CudaDouble", "NvmlDouble", "active", "stop", "use"]
