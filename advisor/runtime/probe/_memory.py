"""Measuring memory inside the child: a live-bytes tracker on the CPU, torch + NVML on a GPU.

CPU protocol: a ``TorchDispatchMode`` adds the bytes of every new untyped storage an operator
returns and subtracts them when the storage is freed (a weak-reference callback on the
storage, which PyTorch keeps as one Python object per storage). This is the method
DESIGN.md found to agree with the fake-tensor simulation (3.018 vs 3.0175 GiB on a 0.5B LoRA
step). Process RSS is not used: the C allocator keeps freed pages, so RSS overstates the peak.

GPU protocol: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` (the caching
allocator's own counters) and the whole process's memory from NVML, sampled every 20 ms by a
thread and at every step's end. Both are asked through advisor.runtime.cuda_boundary, so that the
CUDA test double (advisor.runtime.cuda_double) can answer them on a machine without a GPU.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Iterable

CPU_METHOD = "live-bytes tracker (TorchDispatchMode over untyped storages, freed through weak references)"
CUDA_METHOD = "torch.cuda.max_memory_allocated (caching allocator)"


def _dispatch_mode_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class LiveBytes:
    """Live and peak bytes of every tensor storage created while it is active (see module doc)."""

    def __init__(self) -> None:
        import torch
        from torch.utils._pytree import tree_map_only

        self._torch = torch
        self._tree_map_only = tree_map_only
        self.current = 0
        self.peak = 0
        self.phase = "build"
        self.peak_phase = ""
        self._seen: dict[int, Any] = {}
        self._lock = threading.Lock()
        base = _dispatch_mode_base()
        tracker = self

        class _Mode(base):  # type: ignore[misc, valid-type]
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker._tree_map_only(torch.Tensor, tracker.track, out)
                return out

        self._mode = _Mode()

    def track(self, tensor: Any) -> None:
        """Count ``tensor``'s storage once, until it is freed."""
        try:
            st = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse / meta / subclasses without storage
            return
        n = st.nbytes()
        if n == 0 or st.device.type == "meta":
            return
        key = id(st)
        with self._lock:
            if key in self._seen:
                return

            def freed(_ref, n=n, key=key, tracker=self):
                with tracker._lock:
                    tracker.current -= n
                    tracker._seen.pop(key, None)

            self._seen[key] = weakref.ref(st, freed)
            self.current += n
            if self.current > self.peak:
                self.peak = self.current
                self.peak_phase = self.phase

    def track_all(self, tensors: Iterable[Any]) -> None:
        for t in tensors:
            if isinstance(t, self._torch.Tensor):
                self.track(t)

    def reset_peak(self) -> None:
        self.peak = self.current
        self.peak_phase = self.phase

    def set_phase(self, name: str) -> None:
        self.phase = name

    def __enter__(self) -> "LiveBytes":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


class _SimulateTracker:
    """The simulate backend's own tracker (advisor.runtime.simulate.tracker), behind LiveBytes's interface,
    so that the CPU probe and the simulation count bytes the same way (512-byte blocks included)."""

    def __init__(self, mode: Any) -> None:
        self._mode = mode

    @property
    def peak(self) -> int:
        return int(self._mode.peak.bytes)

    @property
    def current(self) -> int:
        return int(self._mode.live_bytes)

    @property
    def peak_phase(self) -> str:
        return str(self._mode.peak.phase)

    def set_phase(self, name: str) -> None:
        self._mode.phase = name

    def track_all(self, tensors: Iterable[Any]) -> None:
        for t in tensors:
            self._mode.track(t)

    def reset_peak(self) -> None:
        self._mode.reset_peak()

    def __enter__(self) -> "_SimulateTracker":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


def make_tracker() -> tuple[Any, str]:
    """The simulate backend's tracker when it is installed (same counting rules), else LiveBytes."""
    try:
        from advisor.runtime.simulate.tracker import BLOCK, LiveBytes as SimLiveBytes

        mode = SimLiveBytes()
        for attr in ("track", "reset_peak", "peak", "live_bytes"):
            getattr(mode, attr)
        return _SimulateTracker(mode), (f"advisor.runtime.simulate.tracker live-bytes tracker (storages rounded up to "
                                        f"{BLOCK} B, as the simulation counts them), on real CPU tensors")
    except (ImportError, AttributeError):
        return LiveBytes(), CPU_METHOD


def module_tensors(model: Any, optimizer: Any = None) -> list[Any]:
    """Every tensor a training setup holds: parameters, buffers, quantization state, optimizer state."""
    out = []
    for p in model.parameters():
        out.append(p)
        out.extend(_quant_state_tensors(p))
    out.extend(model.buffers())
    if optimizer is not None:
        for state in getattr(optimizer, "state", {}).values():
            out.extend(v for v in state.values() if hasattr(v, "untyped_storage"))
    return out


def _quant_state_tensors(p: Any) -> list[Any]:
    """absmax / code / nested state of a bitsandbytes Params4bit, SCB of an Int8Params."""
    out = []
    qs = getattr(p, "quant_state", None)
    while qs is not None:
        out.extend(t for t in (getattr(qs, "absmax", None), getattr(qs, "code", None),
                               getattr(qs, "offset", None)) if hasattr(t, "untyped_storage"))
        qs = getattr(qs, "state2", None)
    scb = getattr(p, "SCB", None)
    if hasattr(scb, "untyped_storage"):
        out.append(scb)
    return out


def _unique_bytes(tensors: Iterable[Any], seen: set[int]) -> int:
    total = 0
    for t in tensors:
        if t is None or not hasattr(t, "untyped_storage"):
            continue
        st = t.untyped_storage()
        key = st.data_ptr() or id(st)
        if key in seen:
            continue
        seen.add(key)
        total += st.nbytes()
    return total


def persistent_breakdown(model: Any, optimizer: Any, *, peft: bool, grads_bytes: int) -> dict[str, int]:
    """Measured bytes of the tensors that outlive a step, by ledger category.

    Trainable parameters are adapter_weights under PEFT, weights otherwise; gradients are the
    ones measured after the last backward (before the optimizer step frees them).
    """
    seen: set[int] = set()
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    quant = [t for p in model.parameters() for t in _quant_state_tensors(p)]
    out = {
        "quant_constants": _unique_bytes(quant, seen),
        "adapter_weights" if peft else "weights": _unique_bytes(trainable, seen),
    }
    out["weights"] = out.get("weights", 0) + _unique_bytes(frozen, seen) + _unique_bytes(model.buffers(), seen)
    states = []
    if optimizer is not None:
        for state in getattr(optimizer, "state", {}).values():
            states.extend(v for v in state.values() if hasattr(v, "untyped_storage"))
    out["optimizer_states"] = _unique_bytes(states, seen)
    out["gradients"] = grads_bytes
    return out


def grads_bytes(model: Any) -> int:
    return _unique_bytes((p.grad for p in model.parameters() if p.grad is not None), set())


class CudaMemory:
    """Peak allocated / reserved from the caching allocator, and the process's NVML memory."""

    def __init__(self, device_index: int = 0) -> None:
        from advisor.runtime import cuda_boundary

        self.cuda = cuda_boundary.cuda()
        """torch.cuda, or the CUDA test double in its place."""
        double = cuda_boundary.double()
        self.method = double.method if double is not None else CUDA_METHOD
        """How peak_allocated is measured (ProbeResult.memory_method)."""
        self._per_process = double.nvml_method if double is not None else "NVML per-process usedGpuMemory"
        self.index = device_index
        self.nvml_peak = 0
        self.nvml_method = ""
        self._handle = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline_used: int | None = None
        self._nvml = None
        try:
            nvml = cuda_boundary.nvml()
            nvml.nvmlInit()
            self._nvml = nvml
            self._handle = nvml.nvmlDeviceGetHandleByIndex(device_index)
            self._baseline_used = int(nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception:  # noqa: BLE001 - no NVML (or no nvidia-ml-py): the torch counters remain
            self._handle = None

    def process_bytes(self) -> int | None:
        """This process's GPU memory: NVML's per-process figure, else device used minus used before we started."""
        if self._handle is None:
            return None
        pid = os.getpid()
        try:
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    self.nvml_method = self._per_process
                    return int(proc.usedGpuMemory)
            used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception:  # noqa: BLE001
            return None
        self.nvml_method = "NVML device used minus used before the probe (process not visible in this PID namespace)"
        return max(0, used - (self._baseline_used or 0))

    def sample(self) -> int | None:
        n = self.process_bytes()
        if n is not None and n > self.nvml_peak:
            self.nvml_peak = n
        return n

    def start_sampler(self, period_s: float = 0.02) -> None:
        if self._handle is None:
            return

        def loop() -> None:
            while not self._stop.wait(period_s):
                self.sample()

        self._thread = threading.Thread(target=loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)

    def reset_peak(self) -> None:
        self.cuda.reset_peak_memory_stats(self.index)

    def peak_allocated(self) -> int:
        return int(self.cuda.max_memory_allocated(self.index))

    def peak_reserved(self) -> int:
        return int(self.cuda.max_memory_reserved(self.index))

    def alloc_retries(self) -> int:
        """cudaMalloc calls retried after freeing the cache (``num_alloc_retries`` of torch.cuda.memory_stats):
        each one synchronizes the device and releases every unused cached segment (c10/cuda/
        CUDACachingAllocator.cpp, ``release_cached_blocks``), so they cost time as well as memory."""
        return int(self.cuda.memory_stats(self.index).get("num_alloc_retries", 0))


# ---------------------------------------------------------------------------------------------- calibration


def measure_overheads(device_index: int = 0) -> dict[str, Any]:
    """What a fresh CUDA process holds outside its tensors, measured (for advisor.memory.calibration).

    Protocol: NVML's baseline before CUDA starts (``CudaMemory``); create the context with one
    small tensor; ``memory_allocated`` before and after the first bf16 matmul and linear layer (their
    outputs freed) gives the cuBLAS / cuBLASLt workspaces, which torch takes from the caching
    allocator; then NVML's process memory minus ``memory_reserved`` is the CUDA context (kernels,
    driver state, everything outside the allocator). Under the CUDA test double the same protocol runs
    on the CPU and ``test_double`` names the catalog GPU it stood for.
    """
    import torch

    from advisor.runtime import cuda_boundary

    cuda = cuda_boundary.cuda()
    if not cuda.is_available():
        raise RuntimeError("no CUDA GPU: torch.cuda.is_available() is False")
    mem = CudaMemory(device_index)
    where = cuda_boundary.tensor_device("cuda")
    dev = torch.device(where, device_index) if where == "cuda" else torch.device(where)
    x = torch.ones(1, device=dev)
    cuda.synchronize(dev)
    a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(1024, device=dev, dtype=torch.bfloat16)
    cuda.synchronize(dev)
    before = cuda.memory_allocated(dev)
    out = a @ w                                          # cublasGemmEx: the cuBLAS workspace
    out2 = torch.nn.functional.linear(a, w, bias)        # cublasLt with a bias epilogue: its workspace
    cuda.synchronize(dev)
    del out, out2
    workspace = cuda.memory_allocated(dev) - before
    process = mem.process_bytes()
    reserved = cuda.memory_reserved(dev)
    del x, a, w, bias
    mem.stop()
    if process is None:
        raise RuntimeError("NVML cannot see this process's memory (nvidia-ml-py missing or no NVML)")
    double = cuda_boundary.double()
    return {"gpu": cuda.get_device_name(dev), "cuda_context_bytes": int(process - reserved),
            "cublas_workspace_bytes": int(workspace), "process_bytes": int(process), "reserved_bytes": int(reserved),
            "method": mem.nvml_method, "test_double": double.key if double is not None else None}
