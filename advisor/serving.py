"""The analytic ledger of inference: weights in their format, the KV cache, and prefill.

Notation: L layers, n_kv key/value heads, d head_dim, P prefill tokens, p bytes of the compute dtype.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from advisor.catalog import GpuSpec, ModelSpec
from advisor.errors import AdvisorInputError
from advisor.ledger import MemoryReport
from advisor.overhead import framework_overhead

WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp16", "fp8")
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class ServePlan:
    """One way to serve a model."""

    weight_format: str = "bf16"
    """bf16/fp16, fp8 (per-channel scales), int8 (W8A16), int4 (AWQ/GPTQ-style groups)."""
    group_size: int = 128
    """Weights per scale/zero-point group for int4."""
    kv_dtype: str = "bf16"
    """dtype of the KV cache."""
    context_len: int = DEFAULT_CONTEXT
    """Tokens per sequence (prompt + generation)."""
    concurrency: int = 1
    """Sequences served at once."""
    block_size: int = 16
    """Tokens per KV block (vLLM --block-size); the cache is allocated in whole blocks."""

    def validate(self) -> "ServePlan":
        if self.weight_format not in WEIGHT_FORMATS:
            raise AdvisorInputError("--weight-format", f"must be one of {', '.join(WEIGHT_FORMATS)}", self.weight_format)
        if self.kv_dtype not in KV_DTYPES:
            raise AdvisorInputError("--kv-dtype", f"must be one of {', '.join(KV_DTYPES)}", self.kv_dtype)
        for flag, v in (("--context-len", self.context_len), ("--concurrency", self.concurrency),
                        ("--block-size", self.block_size), ("--group-size", self.group_size)):
            if not isinstance(v, int) or v < 1:
                raise AdvisorInputError(flag, "must be a whole number of at least 1", v)
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_cache_bytes_per_token(model: ModelSpec, kv_dtype: str = "bf16") -> int:
    """K and V of every layer for one token: 2 * L * n_kv * d * bytes (GQA-aware; Kwon et al. 2023, vLLM §2)."""
    return int(2 * model.num_layers * model.num_kv_heads * model.head_dim * BYTES[kv_dtype])


def serve_weight_bytes(model: ModelSpec, fmt: str, group_size: int = 128) -> tuple[int, int]:
    """(weights, quantization constants) for serving; embeddings and lm_head stay 16-bit."""
    linear = model.num_layers * model.layer_linear_params()
    other = model.params_total - linear
    if fmt in ("bf16", "fp16"):
        return int(model.params_total * 2), 0
    rows = model.num_layers * sum(o for _, o in model.linear_shapes().values())
    if fmt in ("fp8", "int8"):
        # one fp32 scale per output channel (vLLM fp8 / compressed-tensors channel-wise scheme)
        return int(linear + other * 2), int(rows * 4)
    # AWQ/GPTQ: packed 4-bit weights, an fp16 scale and a 4-bit zero point per group (Lin et al. 2024 AWQ §3.2)
    return int(linear * 0.5 + other * 2), int(linear / group_size * (2 + 0.5))


def estimate_inference(model: ModelSpec, plan: ServePlan, gpu: GpuSpec | None = None) -> MemoryReport:
    plan.validate()
    weights, consts = serve_weight_bytes(model, plan.weight_format, plan.group_size)
    per_token = kv_cache_bytes_per_token(model, plan.kv_dtype)
    blocks_per_seq = -(-plan.context_len // plan.block_size)
    kv = plan.concurrency * blocks_per_seq * plan.block_size * per_token
    p = 2
    P = plan.concurrency * plan.context_len
    h, i = model.hidden_size, model.intermediate_size
    # prefill keeps no activations for backward: one layer's working set at a time (residual, normed
    # input, q/k/v, attention output, gate/up and their product), plus last-token logits in fp32
    # (transformers generate: logits_to_keep=1)
    layer = p * P * (2 * h + model.q_dim + 2 * model.kv_dim + model.q_dim + 3 * i)
    logits = plan.concurrency * model.vocab_size * (p + 4)
    transient = layer + logits
    device = {"weights": weights, "quant_constants": consts, "kv_cache": kv, "transient": transient}
    tensor_peak = sum(device.values())
    overhead, _ = framework_overhead(tensor_peak, gpu)
    device["overhead"] = overhead
    return MemoryReport(
        source="estimated", backend="estimate", device=device, host={},
        tensor_peak_bytes=int(tensor_peak), peak_bytes=int(tensor_peak + overhead), peak_phase="prefill",
        extra={"kv_cache_bytes_per_token": per_token, "tokens_in_flight": plan.concurrency * plan.context_len},
    )
