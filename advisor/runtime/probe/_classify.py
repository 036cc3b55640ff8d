"""Classify how a probe failed and boil the message down to one line."""

from __future__ import annotations

import re
import signal

_OOM_MARKERS = (
    "out of memory",                 # torch.OutOfMemoryError (CUDA caching allocator), cudaErrorMemoryAllocation
    "can't allocate memory",         # c10 DefaultCPUAllocator under a memory limit
    "cannot allocate memory",        # ENOMEM from the C library
    "cublas_status_alloc_failed",    # cuBLAS could not get its workspace
    "memoryerror",
)
_CUDA_ERROR_MARKERS = ("cuda error", "cublas_status", "cudnn_status", "illegal memory access",
                       "device-side assert", "nccl error", "cuda driver error")
_NOISE = (
    re.compile(r"\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?"),
    re.compile(r"\s*(Of the allocated memory|If reserved but unallocated|See documentation for Memory).*$"),
    re.compile(r"\s*CUDA kernel errors might be asynchronously reported.*$"),
)


def essence(text: str, limit: int = 300) -> str:
    """The first meaningful line of an error, without allocator boilerplate, at most ``limit`` characters."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    for pattern in _NOISE:
        line = pattern.sub("", line)
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def status_of_exception(exc_type: str, text: str, limited: bool = False) -> str:
    """oom for every out-of-memory form, crash for CUDA errors (the context is lost), else error.

    ``limited``: the process ran under a memory limit (RLIMIT_DATA), where oneDNN reports a scratchpad it
    cannot allocate as "could not create a primitive" (measured on a CPU probe of a 25 MiB step: at a 48 MiB
    limit, and fine at 96 MiB)."""
    lowered = f"{exc_type} {text}".lower()
    # BudgetTooSmall (advisor.runtime.probe._limits): the budget cannot hold even the CUDA context
    if exc_type in ("OutOfMemoryError", "MemoryError", "BudgetTooSmall") or any(m in lowered for m in _OOM_MARKERS):
        return "oom"
    if limited and "could not create a primitive" in lowered:
        return "oom"
    if any(m in lowered for m in _CUDA_ERROR_MARKERS):
        return "crash"
    return "error"


def describe_exit(returncode: int | None) -> str:
    """"exit 0", "exit 3" or "signal SIGSEGV" for a Popen return code."""
    if returncode is None:
        return "running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def last_error_line(log_text: str) -> str:
    """The most telling line of a child's stderr: a fatal-error line, else the last exception line, else ""."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("Fatal Python error"):
            return ln
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", ln) and "Warning" not in ln:
            return ln
    return ""
