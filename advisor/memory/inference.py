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
compute dtype (2), T tokens in one forward pass, B concurrent sequences; a routed layer runs R = T x k rows through
its E experts of width I.

Any architecture: weights and the cache come from the model's description (advisor.core.architecture, a meta-device
build). Every expert is resident: the stacked experts count in full, quantized with the linears in fp8 / int8 /
int4, and gpt-oss's experts stay in MXFP4 where vLLM has a kernel for it. Each layer's cache is what transformers'
own cache holds for it: a sliding-window layer at most its window, a Gated DeltaNet layer a fixed recurrent state
per sequence, multi-head latent attention its compressed latent (``kv_cache_bytes_per_sequence``). The dense
per-token formula 2 L n_kv d p is the special case of every layer caching K and V for every token.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from advisor.core.catalog import MIB, GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.fit import usable_bytes
from advisor.memory.ledger import KvCache, MemoryReport

WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "int8", "int4", "mxfp4")
KV_DTYPES = ("bf16", "fp16", "fp8")
QUANT_METHODS = ("awq", "gptq")
ENGINES = ("vllm", "hf")
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "mxfp4": 0.5}
MXFP4_BLOCK = 32
"""FP4 (e2m1) values sharing one 8-bit power-of-two scale (e8m0) in MXFP4 (OCP Microscaling Formats spec v1.0;
how gpt-oss ships its experts: vLLM blog "vLLM Now Supports gpt-oss", 2025-08-05)."""
DEFAULT_CONTEXT = 4096
DEFAULT_BATCHED_TOKENS = 2048
"""vLLM's default max_num_batched_tokens for `vllm serve` on GPUs under 70 GiB (vllm/engine/arg_utils.py
``EngineArgs.get_batch_defaults``: OPENAI_API_SERVER 2048; 8192 on H100-class cards). The export pins it."""
COMPUTE_BYTES = 2


@dataclass(frozen=True)
class ServePlan:
    """One way to serve a model."""

    weight_format: str = "bf16"
    """bf16/fp16, fp8 (per-channel scales), int8 (W8A16), int4 (AWQ/GPTQ-style groups), mxfp4 (gpt-oss's experts as
    its checkpoint ships them, the rest bf16)."""
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
    vision: Any = None
    """A vision-language model's served images (advisor.memory.serve_vision.ServeVision): their tokens are part
    of ``context_len``, and vLLM's multimodal terms follow from them; None: a text model."""

    def validate(self) -> "ServePlan":
        if self.weight_format not in WEIGHT_FORMATS:
            raise AdvisorInputError("--weight-format", f"must be one of {', '.join(WEIGHT_FORMATS)}",
                                    self.weight_format)
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
        if self.vision is not None:
            from advisor.memory.serve_vision import check_context

            check_context(self.vision, self.context_len)
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
        v = self.vision
        img = f" ({v.tokens} {'image' if not v.video_tokens else 'image+video'} tokens)" if v is not None and \
            v.tokens else ""
        return f"{w} kv:{self.kv_dtype} ctx {self.context_len}{img} x {self.concurrency} seq, block {self.block_size}"

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields (a text model's exactly as before); the served images are the output's ``vision``."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "vision"}
        if self.vision is not None:
            d["image_tokens"] = self.vision.tokens
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ServePlan":
        names = {f.name for f in fields(cls)} - {"vision"}
        return cls(**{k: v for k, v in d.items() if k in names})


def kv_cache_bytes_per_token(model: ModelSpec, kv_dtype: str = "bf16") -> int:
    """Cache growth per token over every layer, as if no window capped it: 2 * L * n_kv * d * bytes for dense
    attention (GQA-aware; Kwon et al. 2023, vLLM §2), the compressed latent of multi-head latent attention, nothing
    for a recurrent layer (transformers' own cache, measured on the meta device: ArchitectureDescription)."""
    d = model.description
    return int(d.kv_bytes_per_token_uncapped() * BYTES[kv_dtype] / d.dtype_bytes)


def kv_tokens(plan: ServePlan, engine: str = "vllm") -> int:
    """Token slots a full-attention layer holds for every sequence: whole blocks per sequence in vLLM (PagedAttention
    allocates blocks of ``block_size`` tokens, Kwon et al. 2023 §4.2); the static cache holds B x context exactly."""
    if engine == "hf":
        return plan.concurrency * plan.context_len
    blocks_per_seq = -(-plan.context_len // plan.block_size)
    return plan.concurrency * blocks_per_seq * plan.block_size


def kv_cache_bytes_per_sequence(model: ModelSpec, plan: ServePlan, engine: str = "vllm") -> int:
    """Cache bytes one sequence of ``plan.context_len`` tokens holds, layer by layer.

    - ``hf`` (transformers ``StaticCache``): a full or latent layer ``context_len`` tokens; a sliding-window layer its
      whole window (``StaticSlidingWindowLayer``: min(window, max_cache_len)); a linear-attention layer its conv and
      recurrent states (``LinearAttentionLayer``, the recurrent state fp32 whatever the KV dtype).
    - ``vllm`` (vllm/v1/kv_cache_interface.py ``max_memory_usage_bytes``): full and latent layers whole blocks of
      ``context_len`` tokens (``FullAttentionSpec``; ``MLAAttentionSpec`` one latent vector per token); a
      sliding-window layer the last window - 1 tokens plus one chunked-prefill step, plus one block
      (``SlidingWindowSpec``); a recurrent layer one state per request (``MambaSpec``, mamba_cache_mode none). The
      hybrid allocator gives each layer type its own blocks (docs.vllm.ai design/hybrid_kv_cache_manager); the padding
      vLLM adds so that attention and recurrent pages have one size is not modelled."""
    d = model.description
    scale = BYTES[plan.kv_dtype] / d.dtype_bytes
    C, blk = plan.context_len, plan.block_size
    total = 0.0
    for layer in d.layers:
        c = layer.cache
        if c is None:
            continue
        if c.max_tokens is not None:  # a sliding window: the dynamic cache keeps window - 1 tokens
            window = c.max_tokens + 1
            kept = min(window, C) if engine == "hf" else \
                (-(-min(window - 1 + plan.batched_tokens, C) // blk) + 1) * blk
        else:
            kept = C if engine == "hf" else -(-C // blk) * blk
        total += c.bytes_per_token * scale * kept + c.fixed_bytes
    return int(total)


def kv_cache_bytes(model: ModelSpec, plan: ServePlan, engine: str = "vllm") -> int:
    """The cache of every sequence in flight (``plan.concurrency`` sequences of ``plan.context_len`` tokens)."""
    return plan.concurrency * kv_cache_bytes_per_sequence(model, plan, engine)


def _linear_weights(model: ModelSpec) -> tuple[int, int]:
    """(weights, output rows) of every ``nn.Linear`` of the decoder layers (what a quantized checkpoint quantizes
    besides the experts)."""
    weights = rows = 0
    for layer in model.description.layers:
        for m in layer.linears:
            weights += m.in_features * m.out_features
            rows += m.out_features
    return weights, rows


def _expert_weights(model: ModelSpec) -> tuple[int, int]:
    """(weights, output rows over every expert) of the stacked experts: every expert is resident."""
    weights = rows = 0
    for layer in model.description.layers:
        for e in layer.experts:
            if e.in_features:
                weights += e.numel
                rows += e.shape[0] * e.out_features
    return weights, rows


def _fp32_extra(model: ModelSpec) -> int:
    """Bytes beyond 2 per parameter of the modules the model class keeps in fp32 whatever the dtype (DeepSeek-V2's
    router: ``_keep_in_fp32_modules_strict``)."""
    return sum(2 * layer.router_params for layer in model.description.layers if layer.router_dtype == "float32")


def ships_mxfp4_experts(model: ModelSpec) -> bool:
    """The model's published checkpoint holds its experts in MXFP4 (serve_priors.yaml ``mxfp4``: gpt-oss)."""
    from advisor.core.serve_priors import load_priors

    return model.is_moe and model.model_type in load_priors()["mxfp4"]["model_types"]


def serve_weight_bytes(model: ModelSpec, fmt: str, group_size: int = 128) -> tuple[int, int]:
    """(weights, quantization constants) for serving; embeddings, norms, routers and lm_head stay 16-bit.

    Every expert is resident. fp8 / int8 / int4 quantize the decoder linears and the stacked experts alike (vLLM's
    fused-MoE methods of those schemes: Fp8MoEMethod, compressed-tensors WNA16 MoE, AWQ / GPTQ Marlin MoE); mxfp4
    keeps gpt-oss's experts as its checkpoint ships them and the rest in bf16."""
    linear, linear_rows = _linear_weights(model)
    experts, expert_rows = _expert_weights(model)
    if fmt in ("bf16", "fp16"):
        return int(model.params_total * 2 + _fp32_extra(model)), 0
    if fmt == "mxfp4":
        if not ships_mxfp4_experts(model):
            raise AdvisorInputError("--weight-format", "mxfp4 is the format of a checkpoint that ships its experts "
                                    f"in MXFP4 (gpt-oss); {model.name} has none", fmt)
        # 4-bit values and one 8-bit scale per 32 (OCP MX); attention, embeddings and router bf16
        return (int(experts * BYTES["mxfp4"] + (model.params_total - experts) * 2 + _fp32_extra(model)),
                int(experts / MXFP4_BLOCK))
    quantized = linear + experts
    other = model.params_total - quantized
    rows = linear_rows + expert_rows
    if fmt in ("fp8", "int8"):
        # one fp32 scale per output channel (vLLM fp8 / compressed-tensors channel-wise scheme)
        return int(quantized + other * 2 + _fp32_extra(model)), int(rows * 4)
    # AWQ/GPTQ: packed 4-bit weights, an fp16 scale and a 4-bit zero point per group (Lin et al. 2024 AWQ §3.2)
    return int(quantized * 0.5 + other * 2 + _fp32_extra(model)), int(quantized / group_size * (2 + 0.5))


def _mlp_kinds(model: ModelSpec) -> list[tuple[int, int, int, int, int]]:
    """(dense MLP width, shared expert width, experts, top-k, expert width) of each kind of decoder layer."""
    out = []
    for layer, _ in model.description.layer_kinds():
        mlp = [m for m in layer.linears if m.role == "mlp"]
        shared = [m for m in layer.linears if m.role == "shared_experts"]
        width = 0
        if layer.num_experts:
            width = next(e.in_features for e in layer.experts if e.in_features and "down" in e.name)
        out.append((mlp[-1].in_features if mlp else 0, shared[-1].in_features if shared else 0, layer.num_experts,
                    layer.experts_per_token, width))
    return out


def routed_rows_alive(model: ModelSpec, width: int) -> int:
    """Widths alive per routed row at the peak of transformers' grouped-mm experts (integrations/moe.py
    ``grouped_mm_experts_forward``): the gathered input rows (h) stay alive to the end; during the gate the gate_up
    output (2I), act(gate) and the product; during the down matmul the gated rows and its output; when the rows are
    put back in token order the gathered input, the down output, the weighted rows and their permuted copy (4h).
    gpt-oss's gate (modeling_gpt_oss.py ``_apply_gate``) keeps clamped gate and up, the GLU, up + 1 and the product
    (5 widths) beside gate_up: serve_priors.yaml ``expert_gate_alive_widths``."""
    from advisor.core.serve_priors import load_priors

    table = load_priors()["expert_gate_alive_widths"]
    gate = table.get(model.model_type, table["default"])
    h = model.hidden_size
    return max(h + gate * width, 2 * h + width, 4 * h)


def hf_transient(model: ModelSpec, plan: ServePlan, tokens_per_seq: int, batch: int) -> tuple[int, str]:
    """Peak short-lived bytes of one transformers forward of ``batch x tokens_per_seq`` tokens (no grad).

    Inside the MLP of the last layer live: the residual stream, the attention output and the normed input
    and residual sum (4 x T x h), gate, act(gate) and up (3 x T x i); plus rotary cos/sin (2 x s x d; twice for
    Gemma-3's local and global rotary embeddings) and, under sdpa once the prompt reaches a sliding window, the
    boolean mask (s x s) — transformers modeling_qwen2/llama ``DecoderLayer.forward`` and ``MLP.forward``
    (down(act(gate(x)) * up(x))), masking_utils ``sdpa_mask``. A routed layer holds R = T x k rows instead
    (``routed_rows_alive``) and its router's fp32 probabilities (T x E); a shared expert runs after the routed ones
    (3 x T x its width). Eager attention (gpt-oss, Gemma-2: their classes refuse sdpa) materializes the scores of
    every head against the static cache (with the mask added, gpt-oss's sinks concatenated and the max subtracted:
    3 x B x H x s x (C + 1)) beside repeat_kv's expanded keys and values (2 x B x H x C x d). Multi-head latent
    attention decompresses the whole static cache every forward (modeling_deepseek_v2.py: kv_b_proj over the cached
    latents, B x C x H x (nope + v), and the keys assembled from k_nope and k_rot, B x H x C x (nope + rope)).
    At the end: the final norm's output (T x h), last-token logits B x V (``logits_to_keep=1``).
    """
    p = COMPUTE_BYTES
    T = batch * tokens_per_seq
    h = model.hidden_size
    d = model.description
    widest = 0
    for dense, shared, experts, top_k, width in _mlp_kinds(model):
        region = 3 * T * dense
        if experts:
            region = max(region, T * top_k * routed_rows_alive(model, width) + T * experts * 4 // p,
                         3 * T * shared)
        widest = max(widest, region)
    rotary = 2 * tokens_per_seq * model.head_dim * (2 if "rope_local_base_freq" in model.config else 1)
    windows = [layer.cache.max_tokens + 1 for layer in d.layers if layer.cache is not None and layer.cache.max_tokens]
    mask = tokens_per_seq ** 2 / p if (model.supports_attention("sdpa") and windows
                                       and tokens_per_seq >= min(windows)) else 0
    mlp = p * (4 * T * h + widest + rotary + mask)
    head = p * (2 * T * h + batch * model.vocab_size)
    regions = {"mlp": mlp, "logits": head}
    C = plan.context_len
    if not model.supports_attention("sdpa"):  # eager attention over the static cache
        H, hd = model.num_heads, model.head_dim
        if any(layer.attention in ("full", "mla") for layer in d.layers):
            kv = C
        else:
            kv = max(windows)
        regions["attention"] = p * (4 * T * h + 3 * batch * H * tokens_per_seq * (kv + 1) + 2 * batch * H * kv * hd)
    if windows and model.supports_attention("sdpa"):
        # a static sliding-window layer rolls its window into new key and value tensors as it updates (cache_utils
        # StaticSlidingWindowLayer.update): one layer's window of K and V, what a decode step's peak holds
        w = min(max(windows), C)
        regions["attention"] = p * (4 * T * h + 2 * batch * model.num_kv_heads * w * model.head_dim)
    if d.mla is not None:
        mla, H = d.mla, model.num_heads
        dqk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        regions["attention"] = p * (4 * T * h + batch * C * H * (mla.qk_nope_head_dim + mla.v_head_dim)
                                    + batch * H * C * dqk + 2 * T * H * dqk)
    where = max(regions, key=regions.get)
    return int(regions[where]), where


def _per_token_width(model: ModelSpec) -> int:
    """Activation widths one token needs in vLLM's forward at its widest layer (fused qkv and gate_up): residual and
    hidden (2h), a dense MLP's gate_up and activation (3i), or a routed layer's fused-MoE workspace per token
    (k x (2I + I + h): vllm/model_executor/layers/fused_moe/fused_moe.py ``fused_experts_impl``'s intermediate
    caches 1-3) with a shared expert's 3 widths."""
    h = model.hidden_size
    widest = 0
    for dense, shared, experts, top_k, width in _mlp_kinds(model):
        widest = max(widest, 3 * dense, top_k * (3 * width + h) + 3 * shared if experts else 0)
    return 2 * h + widest


def vllm_activations(model: ModelSpec, plan: ServePlan) -> int:
    """Peak activations of vLLM's profiling run, which it keeps reserved outside the KV cache.

    ``profile_run`` runs ``max_num_batched_tokens`` tokens (vllm/v1/worker/gpu_model_runner.py ``_dummy_run``):
    with fused qkv and gate_up projections the MLP holds residual and hidden (2 x T x h), gate_up (2 x T x i)
    and its activation (T x i), or a routed layer's fused-MoE workspaces (``_per_token_width``); the dummy sampler
    run (``_dummy_sampler_run``) holds fp32 logits for max_num_seqs rows and their softmax/log-softmax (3 x B x V x 4).
    """
    p = COMPUTE_BYTES
    T = plan.batched_tokens
    forward = p * T * _per_token_width(model)
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
    return int(pri["fixed_mib"] * MIB + COMPUTE_BYTES * batch * _per_token_width(model))


@lru_cache(maxsize=64)
def _overhead_terms(gpu: GpuSpec | None) -> dict:
    from advisor.memory.overhead import overhead_terms

    return overhead_terms(gpu)


def estimate_inference(model: ModelSpec, plan: ServePlan, gpu: GpuSpec | None = None,
                       engine: str = "vllm") -> MemoryReport:
    """The serving ledger at its peak (prefill), with the cache of every sequence in flight."""
    plan.validate()
    if engine not in ENGINES:
        raise AdvisorInputError("engine", f"must be one of {', '.join(ENGINES)}", engine)
    weights, consts = serve_weight_bytes(model, plan.weight_format, plan.group_size)
    per_token = kv_cache_bytes_per_token(model, plan.kv_dtype)
    per_sequence = kv_cache_bytes_per_sequence(model, plan, engine)
    tokens = kv_tokens(plan, engine)
    kv = plan.concurrency * per_sequence
    notes: list[str] = []
    device = {"weights": weights, "quant_constants": consts, "kv_cache": kv}
    extra: dict[str, Any] = {"kv_cache_bytes_per_token": per_token, "kv_cache_bytes_per_sequence": per_sequence,
                             "tokens_in_flight": tokens, "engine": engine}
    kinds = model.description.attention_kinds()
    if set(kinds) != {"full"}:
        dense = int(2 * model.num_layers * model.num_kv_heads * model.head_dim * BYTES[plan.kv_dtype])
        notes.append("cache by layer kind (" + ", ".join(f"{k} x{n}" for k, n in kinds.items()) + f"): "
                     f"{per_sequence:,} B per sequence of {plan.context_len:,} tokens, where the dense formula "
                     f"2 L n_kv d p would say {dense * plan.context_len:,} B")
    if model.is_moe:
        moe = model.moe
        notes.append(f"all {moe.num_experts} experts of every routed layer are resident (top-{moe.experts_per_token} "
                     "run per token)"
                     + (": MXFP4 as the checkpoint ships them" if plan.weight_format == "mxfp4" else ""))
    if engine == "vllm":
        act = vllm_activations(model, plan)
        graphs = cuda_graph_reserve(model, plan)
        device["transient"] = act
        device["cuda_graphs"] = graphs
        tensor_peak = weights + consts + kv + act + graphs
        if model.vision is not None:
            vision_rows = _vllm_vision_rows(model, plan, act, extra, notes)
            device.update(vision_rows)
            tensor_peak += sum(vision_rows.values())
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
        if model.vision is not None:
            from advisor.memory.serve_vision import hf_tower_bytes

            # transformers loads the tower and projector in bf16 with the model, and runs the tower on every
            # prompt's images before the prefill (the larger of the two forwards is the peak)
            device["vision_weights"] = int(model.vision.params * COMPUTE_BYTES)
            tower = hf_tower_bytes(model, plan.vision, plan.concurrency)
            if tower > prefill:
                prefill, where = tower, "vision tower"
        device["transient"] = prefill
        tensor_peak = weights + consts + kv + prefill + device.get("vision_weights", 0)
        from advisor.memory.overhead import framework_overhead

        # the weights are loaded once, a segment each; what fragments is what comes and goes: the
        # KV cache that DynamicCache grows by torch.cat every token, and the forward's activations
        overhead, _ = framework_overhead(kv + prefill, gpu)
        extra.update(prefill_transient=prefill, decode_transient=decode, prefill_peak_in=where,
                     prompt_len=plan.prompt_len)
        phase = "prefill"
        if plan.weight_format not in ("bf16", "fp16"):
            notes.append("transformers kernels for quantized weights may dequantize a layer at a time: not modelled")
    device["overhead"] = int(overhead)
    return MemoryReport(
        source="estimated", backend="estimate", device={k: int(v) for k, v in device.items()}, host={},
        tensor_peak_bytes=int(tensor_peak), peak_bytes=int(tensor_peak + overhead), peak_phase=phase,
        notes=tuple(notes), extra=extra, kv_cache=KvCache(per_token, per_sequence, tokens),
    )


def _vllm_vision_rows(model: ModelSpec, plan: ServePlan, act: int, extra: dict, notes: list) -> dict[str, int]:
    """The vision rows of the vLLM ledger (advisor.memory.serve_vision): the tower's weights as vLLM holds them,
    the encoder cache, and the tower's profiling forward where it exceeds the language model's profiling phase.

    vLLM reserves the peak of its profiling run (gpu_worker.py ``determine_available_memory``: the torch peak of
    ``profile_run``), which passes two phases: the tower over the dummy items, beside their pixels
    (``tower_profile``), then the language model's dummy run beside the cached encoder outputs and the same pixels
    (``pixel_values + encoder_cache + act``). The rows sum to the larger: ``transient`` is the language model's,
    ``encoder_cache`` the cached outputs, ``vision_activations`` the rest."""
    from advisor.memory.serve_vision import vllm_vision_terms

    t = vllm_vision_terms(model, plan.vision, plan)
    lm_phase = t["pixel_values"] + t["encoder_cache"] + act
    tower_phase = t["tower_profile"]
    profile = max(lm_phase, tower_phase)
    rows = {"vision_weights": t["vision_weights"], "vision_constants": t["vision_constants"],
            "encoder_cache": t["encoder_cache"], "vision_activations": profile - t["encoder_cache"] - act}
    rows = {k: v for k, v in rows.items() if v or (k == "encoder_cache" and plan.vision is not None
                                                   and plan.vision.enabled)}
    extra["vision_profile"] = {"tower_phase_bytes": tower_phase, "language_model_phase_bytes": lm_phase,
                               "peak_in": "vision tower" if tower_phase > lm_phase else "language model",
                               "encoder_cache_bytes": t["encoder_cache"], "pixel_values_bytes": t["pixel_values"]}
    if not t["vision_weights"]:
        notes.append("limit_mm_per_prompt is 0 for every modality: vLLM builds no vision tower (text only)")
    elif plan.vision is None or not plan.vision.enabled:
        notes.append("no image per prompt: the tower is loaded but vLLM skips the encoder's profiling "
                     "(limit_mm_per_prompt 0)")
    else:
        notes.append(f"vLLM profiles the encoder at its largest item ({plan.vision.item_tokens:,} tokens, "
                     f"{plan.vision.item_patches:,} patches), whatever the served images: lower --max-pixels to "
                     "shrink the encoder cache and the tower's profile")
    return rows


def vllm_memory_utilization(budget_bytes: int, total_bytes: int, headroom: float) -> float:
    """The --gpu-memory-utilization that keeps the whole instance within ``budget x (1 - headroom)`` (the
    feasibility rule training uses too, advisor.core.fit):
    vLLM may use ``total x utilization`` (vllm/config/cache.py ``CacheConfig.gpu_memory_utilization``),
    rounded down to 0.01 so the flag never exceeds the budget; at most 0.98."""
    import math

    u = math.floor(min(usable_bytes(budget_bytes, headroom), total_bytes) / total_bytes * 100) / 100
    return min(u, 0.98)
