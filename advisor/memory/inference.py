"""The analytic ledger of inference: weights in their format, the KV cache, prefill and decode transients.

Two engines are modelled, because they hold memory differently:

- ``vllm``: a paged KV cache of whole blocks, chunked prefill of at most ``max_num_batched_tokens`` tokens
  per step, CUDA graphs, and ``--gpu-memory-utilization`` (the fraction of the GPU's total memory the
  instance may use; the KV cache gets that minus weights minus the peak activations of a profiling run:
  vllm/v1/worker/gpu_worker.py ``determine_available_memory``: ``requested_memory - non_kv_cache_memory
  - cudagraph_memory_estimate``, with ``requested_memory = total * gpu_memory_utilization``).
- ``hf``: transformers ``generate`` with a ``StaticCache`` of ``concurrency x context_len`` tokens, prefilling
  the whole prompt batch at once (what ``advisor.runtime.simulate.inference`` traces and the GPU probe runs).

Notation: L layers, n_kv key/value heads, d head_dim, h hidden, i intermediate, V vocab, p bytes of the
compute dtype (2), T tokens in one forward pass, B concurrent sequences.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any

from advisor.core.catalog import MIB, GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.fit import usable_bytes
from advisor.memory.ledger import MemoryReport

WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp16", "fp8")
QUANT_METHODS = ("awq", "gptq")
ENGINES = ("vllm", "hf")
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
DEFAULT_CONTEXT = 4096
DEFAULT_BATCHED_TOKENS = 2048
"""vLLM's default max_num_batched_tokens for `vllm serve` on GPUs under 70 GiB (vllm/engine/arg_utils.py
``EngineArgs.get_batch_defaults``: OPENAI_API_SERVER 2048; 8192 on H100-class cards). The export pins it."""
COMPUTE_BYTES = 2


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
    """Tokens per sequence (prompt + generation): vLLM --max-model-len, the static cache's max_cache_len."""
    concurrency: int = 1
    """Sequences served at once: vLLM --max-num-seqs, the generate batch size."""
    block_size: int = 16
    """Tokens per KV block (vLLM --block-size); the cache is allocated in whole blocks."""
    quant_method: str = "awq"
    """int4 checkpoint style: awq or gptq (same memory; vLLM --quantization awq_marlin / gptq_marlin)."""
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS
    """vLLM chunked-prefill budget: tokens in one forward pass (prefill chunks + decodes)."""
    max_new_tokens: int = 0
    """Tokens generated per sequence (hf engine); 0: a quarter of the context, at most 512."""

    def validate(self) -> "ServePlan":
        if self.weight_format not in WEIGHT_FORMATS:
            raise AdvisorInputError("--weight-format", f"must be one of {', '.join(WEIGHT_FORMATS)}", self.weight_format)
        if self.kv_dtype not in KV_DTYPES:
            raise AdvisorInputError("--kv-dtype", f"must be one of {', '.join(KV_DTYPES)}", self.kv_dtype)
        if self.quant_method not in QUANT_METHODS:
            raise AdvisorInputError("quant_method", f"must be one of {', '.join(QUANT_METHODS)}", self.quant_method)
        for flag, v in (("--context-len", self.context_len), ("--concurrency", self.concurrency),
                        ("--block-size", self.block_size), ("--group-size", self.group_size),
                        ("max_num_batched_tokens", self.max_num_batched_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise AdvisorInputError(flag, "must be a whole number of at least 1", v)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or \
                not 0 <= self.max_new_tokens < self.context_len:
            raise AdvisorInputError("max_new_tokens", f"must be in [0, context_len={self.context_len})",
                                    self.max_new_tokens)
        return self

    @property
    def new_tokens(self) -> int:
        return self.max_new_tokens or max(1, min(512, self.context_len // 4))

    @property
    def prompt_len(self) -> int:
        return self.context_len - self.new_tokens

    @property
    def batched_tokens(self) -> int:
        """vLLM needs max_num_batched_tokens >= max_num_seqs (vllm/config/scheduler.py ``_verify_args``)."""
        return max(self.max_num_batched_tokens, self.concurrency)

    def short(self) -> str:
        w = f"int4-{self.quant_method}-g{self.group_size}" if self.weight_format == "int4" else self.weight_format
        return f"{w} kv:{self.kv_dtype} ctx {self.context_len} x {self.concurrency} seq, block {self.block_size}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ServePlan":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def kv_cache_bytes_per_token(model: ModelSpec, kv_dtype: str = "bf16") -> int:
    """K and V of every layer for one token: 2 * L * n_kv * d * bytes (GQA-aware; Kwon et al. 2023, vLLM §2)."""
    return int(2 * model.num_layers * model.num_kv_heads * model.head_dim * BYTES[kv_dtype])


def kv_tokens(plan: ServePlan, engine: str = "vllm") -> int:
    """Token slots the KV cache must hold: whole blocks per sequence in vLLM (PagedAttention allocates
    blocks of ``block_size`` tokens, Kwon et al. 2023 §4.2); the static cache holds B x context exactly."""
    if engine == "hf":
        return plan.concurrency * plan.context_len
    blocks_per_seq = -(-plan.context_len // plan.block_size)
    return plan.concurrency * blocks_per_seq * plan.block_size


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


def hf_transient(model: ModelSpec, plan: ServePlan, tokens_per_seq: int, batch: int) -> tuple[int, str]:
    """Peak short-lived bytes of one transformers forward of ``batch x tokens_per_seq`` tokens (no grad).

    Inside the MLP of the last layer live: the residual stream, the attention output and the normed input
    and residual sum (4 x T x h), gate, act(gate) and up (3 x T x i); plus rotary cos/sin (2 x s x d) —
    transformers modeling_qwen2/llama ``DecoderLayer.forward`` and ``MLP.forward`` (down(act(gate(x)) * up(x))).
    At the end: the final norm's output (T x h), last-token logits B x V (``logits_to_keep=1``).
    """
    p = COMPUTE_BYTES
    T = batch * tokens_per_seq
    h, i = model.hidden_size, model.intermediate_size
    mlp = p * (4 * T * h + 3 * T * i + 2 * tokens_per_seq * model.head_dim)
    head = p * (2 * T * h + batch * model.vocab_size)
    return (mlp, "mlp") if mlp >= head else (head, "logits")


def vllm_activations(model: ModelSpec, plan: ServePlan) -> int:
    """Peak activations of vLLM's profiling run, which it keeps reserved outside the KV cache.

    ``profile_run`` runs ``max_num_batched_tokens`` tokens (vllm/v1/worker/gpu_model_runner.py ``_dummy_run``):
    with fused qkv and gate_up projections the MLP holds residual and hidden (2 x T x h), gate_up (2 x T x i)
    and its activation (T x i); the dummy sampler run (``_dummy_sampler_run``) holds fp32 logits for
    max_num_seqs rows and their softmax/log-softmax (3 x B x V x 4).
    """
    p = COMPUTE_BYTES
    T = plan.batched_tokens
    forward = p * T * (2 * model.hidden_size + 3 * model.intermediate_size)
    sampler = 3 * plan.concurrency * model.vocab_size * 4
    return int(max(forward, sampler))


def cuda_graph_reserve(model: ModelSpec, plan: ServePlan) -> int:
    """CUDA graphs captured for decode batch sizes up to min(max_num_seqs, 512) keep a private memory pool
    (vLLM docs "Optimization and tuning": --enforce-eager frees it; vllm/v1/worker/gpu_model_runner.py
    ``capture_model`` logs "Graph capturing finished ... took X GiB"). Modelled as a fixed prior
    (advisor/data/serve_priors.yaml) plus the working set of the largest captured decode batch."""
    from advisor.core.serve_priors import load_priors

    pri = load_priors()["cuda_graph"]
    batch = min(plan.concurrency, pri["max_capture_size"])
    return int(pri["fixed_mib"] * MIB + COMPUTE_BYTES * batch * (2 * model.hidden_size + 3 * model.intermediate_size))


@lru_cache(maxsize=64)
def _overhead_terms(gpu: GpuSpec | None) -> dict:
    from advisor.memory.overhead import overhead_terms

    return overhead_terms(gpu)


def estimate_inference(model: ModelSpec, plan: ServePlan, gpu: GpuSpec | None = None,
                       engine: str = "vllm") -> MemoryReport:
    """The serving ledger at its peak (prefill), with the KV cache for every token in flight."""
    plan.validate()
    if engine not in ENGINES:
        raise AdvisorInputError("engine", f"must be one of {', '.join(ENGINES)}", engine)
    weights, consts = serve_weight_bytes(model, plan.weight_format, plan.group_size)
    per_token = kv_cache_bytes_per_token(model, plan.kv_dtype)
    tokens = kv_tokens(plan, engine)
    kv = tokens * per_token
    notes: list[str] = []
    device = {"weights": weights, "quant_constants": consts, "kv_cache": kv}
    extra: dict[str, Any] = {"kv_cache_bytes_per_token": per_token, "tokens_in_flight": tokens, "engine": engine}
    if engine == "vllm":
        act = vllm_activations(model, plan)
        graphs = cuda_graph_reserve(model, plan)
        device["transient"] = act
        device["cuda_graphs"] = graphs
        tensor_peak = weights + consts + kv + act + graphs
        frag = _overhead_terms(gpu)["fragmentation"] * act  # the KV cache is one allocation; activations fragment
        from advisor.memory.overhead import outside_allocator_bytes

        # the CUDA context and cuBLAS workspace, calibrated on this GPU when it has been (as training's phases)
        overhead = int(outside_allocator_bytes(gpu) + frag)
        extra["max_num_batched_tokens"] = plan.batched_tokens
        notes.append(f"prefill is chunked: at most {plan.batched_tokens} tokens per forward (vLLM chunked prefill)")
        phase = "prefill"
    else:
        prefill, where = hf_transient(model, plan, plan.prompt_len, plan.concurrency)
        decode, _ = hf_transient(model, plan, 1, plan.concurrency)
        device["transient"] = prefill
        tensor_peak = weights + consts + kv + prefill
        from advisor.memory.overhead import framework_overhead

        # the weights are loaded once, a segment each; what fragments is what comes and goes: the
        # KV cache that DynamicCache grows by torch.cat every token, and the forward's activations
        overhead, _ = framework_overhead(kv + prefill, gpu)
        extra.update(prefill_transient=prefill, decode_transient=decode, prefill_peak_in=where,
                     prompt_len=plan.prompt_len)
        phase = "prefill"
        if plan.weight_format != "bf16" and plan.weight_format != "fp16":
            notes.append("transformers kernels for quantized weights may dequantize a layer at a time: not modelled")
    device["overhead"] = int(overhead)
    return MemoryReport(
        source="estimated", backend="estimate", device={k: int(v) for k, v in device.items()}, host={},
        tensor_peak_bytes=int(tensor_peak), peak_bytes=int(tensor_peak + overhead), peak_phase=phase,
        notes=tuple(notes), extra=extra,
    )


def vllm_memory_utilization(budget_bytes: int, total_bytes: int, headroom: float) -> float:
    """The --gpu-memory-utilization that keeps the whole instance within ``budget x (1 - headroom)`` (the
    feasibility rule training uses too, advisor.core.fit):
    vLLM may use ``total x utilization`` (vllm/config/cache.py ``CacheConfig.gpu_memory_utilization``),
    rounded down to 0.01 so the flag never exceeds the budget; at most 0.98."""
    import math

    u = math.floor(min(usable_bytes(budget_bytes, headroom), total_bytes) / total_bytes * 100) / 100
    return min(u, 0.98)
