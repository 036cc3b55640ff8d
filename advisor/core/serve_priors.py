"""The serving priors (advisor/data/serve_priors.yaml): quality of weight / KV formats, CUDA-graph reserve, decode
roofline."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from advisor.core.data_files import load_data_file


@lru_cache(maxsize=None)
def load_priors() -> dict[str, Any]:
    return load_data_file("serve_priors.yaml")


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
