"""Measured beats predicted: real CUDA probes refit the step-time model per GPU model.

A probe's tokens/s replaces the prediction for its own plan (the tuner does that). Each probe on
a GPU model is also recorded here, and that GPU's two scales are refit from all its probes:

    measured step seconds - link terms  =  gpu_scale x (GPU kernel terms) + cpu_scale x (host terms)

by least squares when three or more probes pin both scales down, otherwise one common scale (the
geometric mean of measured / predicted). Predictions for that GPU afterwards use the scales and
are labelled "calibrated (N probes)". The file is JSON, one entry per GPU model, keeping every
probe's model, plan and tokens/s so a refit is always over the raw points:

    $ADVISOR_SPEED_CALIBRATION, else $XDG_CACHE_HOME/vram-advisor/speed_calibration.json
    (~/.cache/... when XDG_CACHE_HOME is unset)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from advisor.core.catalog import GpuSpec, ModelSpec, is_cuda_double
from advisor.core.plan import Plan
from advisor.speed.terms import step_terms

ENV = "ADVISOR_SPEED_CALIBRATION"
SCALE_RANGE = (0.2, 5.0)  # a refit outside this says the probe measured something else: clamp


def calibration_path() -> Path:
    return _path(os.environ.get(ENV), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))


@lru_cache(maxsize=8)
def _path(override: str | None, xdg: str | None, home: str | None) -> Path:
    if override:
        return Path(override).expanduser()
    root = Path(xdg) if xdg else Path(home or Path.home()) / ".cache"
    return root / "vram-advisor" / "speed_calibration.json"


@dataclass(frozen=True)
class GpuCalibration:
    """The refit scales of one GPU model."""

    gpu: str
    """Calibration key: the catalog key, or the NVML name of a GPU not in the catalog."""
    probes: int
    """How many probes the scales were fit on."""
    gpu_scale: float
    """Multiplies the GPU kernel terms (matmul, attention, memory-bound work, optimizer)."""
    cpu_scale: float
    """Multiplies the host terms (launch overhead, per-step fixed cost)."""

    @property
    def label(self) -> str:
        return f"calibrated ({self.probes} probe{'' if self.probes == 1 else 's'})"


def gpu_key(gpu: GpuSpec) -> str:
    """The catalog key; the name of a GPU outside the catalog, or of the CUDA test double's (whose probes ran on
    the CPU: they must never refit the real GPU's scales)."""
    return gpu.key if gpu.key not in ("detected", "") and not is_cuda_double(gpu) else gpu.name


_cache: dict[str, Any] = {"path": None, "mtime": None, "data": {}}


def _read(path: Path) -> dict[str, Any]:
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return {}
    if _cache["path"] == str(path) and _cache["mtime"] == mtime:
        return _cache["data"]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    _cache.update(path=str(path), mtime=mtime, data=data)
    return data


def for_gpu(gpu: GpuSpec, path: Path | None = None) -> GpuCalibration | None:
    """This GPU model's calibration, or None when no probe has run on it."""
    entry = _read(path or calibration_path()).get(gpu_key(gpu))
    if not entry or not entry.get("points"):
        return None
    return GpuCalibration(gpu_key(gpu), len(entry["points"]), float(entry["gpu_scale"]), float(entry["cpu_scale"]))


def record_probe(model: ModelSpec, plan: Plan, gpu: GpuSpec, tokens_per_s: float,
                 path: Path | None = None) -> GpuCalibration:
    """Add one real single-GPU probe's tokens/s and refit this GPU model's scales; returns them."""
    if not tokens_per_s or tokens_per_s <= 0 or not math.isfinite(tokens_per_s):
        raise ValueError(f"a probe's tokens/s must be a positive number, got {tokens_per_s!r}")
    path = path or calibration_path()
    data = dict(_read(path))
    key = gpu_key(gpu)
    entry = dict(data.get(key) or {})
    points = list(entry.get("points", []))
    points.append({"model": model.to_dict(), "plan": plan.to_dict(), "gpu": gpu.to_dict(),
                   "tokens_per_s": float(tokens_per_s), "recorded": time.strftime("%Y-%m-%dT%H:%M:%S")})
    gpu_scale, cpu_scale = refit(points)
    data[key] = {"points": points, "gpu_scale": gpu_scale, "cpu_scale": cpu_scale}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
    return GpuCalibration(key, len(points), gpu_scale, cpu_scale)


def _split(point: dict[str, Any]) -> tuple[float, float, float, float]:
    """(measured step seconds, GPU-kernel, host, link) seconds of one recorded probe."""
    model = ModelSpec(**point["model"])
    plan = Plan.from_dict(point["plan"])
    gpu = GpuSpec(**point["gpu"])
    kinds = {"gpu": 0.0, "cpu": 0.0, "link": 0.0}
    for sec, kind in step_terms(model, plan, gpu).values():
        kinds[kind] += sec
    measured = plan.tokens_per_step / point["tokens_per_s"]
    return measured, kinds["gpu"], kinds["cpu"], kinds["link"]


def _clamp(x: float) -> float:
    return min(max(x, SCALE_RANGE[0]), SCALE_RANGE[1])


def refit(points: list[dict[str, Any]]) -> tuple[float, float]:
    """(gpu_scale, cpu_scale) that best explain the probes' measured step times."""
    rows = [_split(p) for p in points]
    rows = [(max(t - link, 1e-9), g, c) for t, g, c, link in rows if g + c > 0]
    if not rows:
        return 1.0, 1.0
    common = math.exp(sum(math.log(t / (g + c)) for t, g, c in rows) / len(rows))
    if len(rows) >= 3:
        # least squares t = a g + b c, relative errors (each row divided by t)
        sgg = sum((g / t) ** 2 for t, g, c in rows)
        scc = sum((c / t) ** 2 for t, g, c in rows)
        sgc = sum(g * c / t ** 2 for t, g, c in rows)
        sg = sum(g / t for t, g, c in rows)
        sc = sum(c / t for t, g, c in rows)
        det = sgg * scc - sgc ** 2
        if det > 1e-6 * sgg * scc:
            a = (sg * scc - sc * sgc) / det
            b = (sc * sgg - sg * sgc) / det
            if SCALE_RANGE[0] <= a <= SCALE_RANGE[1] and SCALE_RANGE[0] <= b <= SCALE_RANGE[1]:
                return a, b
    return _clamp(common), _clamp(common)
