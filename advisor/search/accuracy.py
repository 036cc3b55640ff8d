"""Accuracy of a plan: measured when a probe had real weights, else a documented prior."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from advisor.core.data_files import load_data_file
from advisor.core.plan import ALL_LINEAR, Plan


@lru_cache(maxsize=1)
def _priors() -> dict[str, Any]:
    """accuracy_priors.yaml, parsed once (the tuner asks for every trial; read-only after this)."""
    return load_data_file("accuracy_priors.yaml")


def accuracy_prior(plan: Plan) -> float:
    """Expected accuracy loss (KL nats/token of the base + adapter capacity penalty), accuracy_priors.yaml."""
    priors = _priors()
    kl = priors["quantization_kl"][plan.quantization]
    if plan.method == "full":
        penalty = priors["adapter_penalty"]["full"]
    elif plan.lora_targets == ALL_LINEAR:
        penalty = priors["adapter_penalty"]["all-linear"]
    else:
        penalty = priors["adapter_penalty"]["partial"]
    return float(kl + penalty)
