"""Library versions, read from package metadata (nothing heavy is imported)."""

from __future__ import annotations

from importlib import metadata

PACKAGES = ("vram-advisor", "torch", "transformers", "peft", "bitsandbytes", "deepspeed", "accelerate", "optuna")


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_environment() -> dict[str, str | None]:
    """NVIDIA driver (NVML) and the CUDA version torch was built with, where there are any."""
    env: dict[str, str | None] = {"driver": None, "cuda": None, "python": None}
    import platform

    env["python"] = platform.python_version()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            env["driver"] = drv.decode() if isinstance(drv, bytes) else drv
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVIDIA driver
        pass
    try:
        import torch

        env["cuda"] = torch.version.cuda
    except ImportError:
        pass
    return env
