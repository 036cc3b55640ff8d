"""Enforcing a memory budget on the child for real, so that going over it is a real out-of-memory.

GPU: ``torch.cuda.set_per_process_memory_fraction`` caps the caching allocator; the CUDA
context (measured through NVML after initializing CUDA) lives outside the allocator, so the
cap is (budget - context) / total: the whole process then fails at the budget.

CPU: ``resource.setrlimit(RLIMIT_DATA)`` on the child, set to what the process already holds
plus the budget. RLIMIT_DATA (Linux >= 4.7) counts private writable mappings (heap and
anonymous mmap: where tensors live) and, unlike RLIMIT_AS, not the address space reserved by
shared libraries and PROT_NONE arena reservations. Both give the same clean
``RuntimeError: DefaultCPUAllocator: can't allocate memory`` for a tensor over the limit
(measured with torch 2.13 on Linux); RLIMIT_DATA was chosen because the baseline it is
added to is the process's real data, not ~0.6 GB of mapped libraries.
"""

from __future__ import annotations

import resource

from advisor.runtime.probe._classify import essence


class BudgetTooSmall(MemoryError):
    """The budget cannot even hold what exists before the model is built (CUDA context)."""


def vm_data_bytes() -> int:
    """VmData of this process (bytes), from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmData not found in /proc/self/status")


def limit_cpu(budget_bytes: int) -> dict[str, int]:
    """Cap this process's data at its current size plus ``budget_bytes``."""
    base = vm_data_bytes()
    cap = base + int(budget_bytes)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    return {"rlimit_data_bytes": cap, "baseline_data_bytes": base}


def limit_cuda(budget_bytes: int, cuda_memory, device: str = "cuda") -> dict[str, int | float]:
    """Cap the caching allocator so the whole process (context included) stays within the budget.

    ``cuda_memory`` (advisor.runtime.probe._memory.CudaMemory) asks torch.cuda, or the CUDA test double; ``device``
    is where its tensors live (advisor.runtime.cuda_boundary.tensor_device)."""
    import torch

    cuda = cuda_memory.cuda
    torch.zeros(1, device=device)  # create the context, so that NVML sees it
    cuda.synchronize()
    context = cuda_memory.sample() or 0
    total = cuda.get_device_properties(cuda_memory.index).total_memory
    allocator_cap = int(budget_bytes) - context
    if allocator_cap <= 0:
        raise BudgetTooSmall(essence(f"the CUDA context alone takes {context:,} B of the {budget_bytes:,} B budget"))
    fraction = min(1.0, allocator_cap / total)
    cuda.set_per_process_memory_fraction(fraction, cuda_memory.index)
    return {"context_bytes": context, "allocator_cap_bytes": allocator_cap, "memory_fraction": fraction,
            "total_bytes": int(total)}
