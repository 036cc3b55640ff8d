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
