"""The serving priors (advisor/data/serve_priors.yaml): quality of weight / KV formats, CUDA-graph reserve, decode roofline."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any


@lru_cache(maxsize=None)
def load_priors() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(resources.files("advisor.data").joinpath("serve_priors.yaml").read_text(encoding="utf-8"))


def quality_prior(weight_format: str, group_size: int, kv_dtype: str) -> float:
    """Expected accuracy recovery (fraction of the 16-bit model's score) of a weight format and KV dtype."""
    q = load_priors()["quality"]
    w = q["weights"][weight_format]
    if isinstance(w, dict):
        sizes = sorted(int(k) for k in w)
        # a group size between the tabulated ones takes the next larger (more lossy) one's figure
        key = next((s for s in sizes if s >= group_size), sizes[-1])
        w = w[key]
    return float(w) * float(q["kv"][kv_dtype])
