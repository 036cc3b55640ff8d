"""Prefill and decode peaks of transformers generation with a static KV cache, traced with fake tensors.

Measurement protocol (as nanoGPT's bench.py writes its own down):
1. build the model from its config (no weights) in bf16 with sdpa attention, inside the live-bytes tracker
   (advisor/runtime/simulate/tracker.py ``LiveBytes``); every parameter and buffer is a recorded storage;
2. make a ``StaticCache(max_cache_len=context_len)``; its K/V tensors are allocated by the first forward
   (transformers cache_utils ``StaticLayer.lazy_initialization``), B x n_kv x context x d per layer;
3. prefill: one forward of ``concurrency x prompt_len`` tokens with ``logits_to_keep=1`` under
   ``torch.no_grad`` (what ``generate`` does); its peak is the prefill peak;
4. decode: one forward of ``concurrency x 1`` tokens at position ``prompt_len``; its peak is the decode peak;
5. the ledger at each peak: parameters and buffers are weights, the static cache's tensors are the KV
   cache, everything else is transient.

With ``fake=False`` the same code runs real CPU tensors (the proof that the fake run equals execution).
Decoder layers repeat by kind, so ``trace_serving_extrapolated`` traces two depths a period of layer kinds apart
and extends linearly (a dense model: 2 and 3 layers).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

from advisor.core.catalog import ModelSpec
from advisor.memory.inference import ServePlan


@dataclass(frozen=True)
class PhasePeak:
    phase: str
    bytes: int
    ledger: dict[str, int]
    """weights, kv_cache, transient at the phase's peak."""


@dataclass(frozen=True)
class ServeTrace:
    """What a traced prefill + decode says about memory."""

    num_layers: int
    prefill: PhasePeak
    decode: PhasePeak
    seconds: float
    fake: bool
    notes: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return max(self.prefill.bytes, self.decode.bytes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["peak_bytes"] = self.peak_bytes
        return d


def serving_model(spec: ModelSpec, num_layers: int | None):
    """The transformers model of ``spec`` for serving (bf16, sdpa, eval mode; ``num_layers`` decoder layers when
    given) and its config: what the simulation traces and the GPU generate probe runs."""
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.core.catalog import build_hf_config

    cfg = build_hf_config(spec.config)
    if num_layers is not None:
        cfg.num_hidden_layers = num_layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:num_layers]
    # sdpa where the class accepts it, else what transformers picks (gpt-oss, Gemma-2: eager); experts by grouped_mm
    attn = "sdpa" if spec.supports_attention("sdpa") else (spec.description.attn_implementation or "eager")
    extra = {"experts_implementation": "grouped_mm"} if spec.is_moe else {}
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=attn, **extra)
    return model.eval(), cfg


def cache_tensors(cache) -> list:
    """Every tensor a transformers cache holds: keys and values of attention layers (full, sliding window, latent),
    and the conv and recurrent states of linear-attention layers (``LinearAttentionLayer``: ``conv_states``,
    ``recurrent_states``), found by walking each cache layer's attributes."""
    import torch

    found = []
    for layer in cache.layers:
        for value in vars(layer).values():
            values = (value.values() if isinstance(value, dict)
                      else value if isinstance(value, (list, tuple)) else [value])
            # the states, not the bookkeeping (``cumulative_length``, initialization flags: scalars)
            found += [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 2]
    return found


def trace_serving(spec: ModelSpec, plan: ServePlan, *, fake: bool = True, num_layers: int | None = None,
                  seed: int = 0) -> ServeTrace:
    """Trace the prefill of ``plan.concurrency x plan.prompt_len`` tokens and one decode step."""
    import torch
    from torch._subclasses import FakeTensorMode

    from advisor.runtime.simulate.tracker import LiveBytes

    plan.validate()
    notes = []
    if plan.weight_format not in ("bf16", "fp16") or plan.kv_dtype not in ("bf16", "fp16"):
        notes.append(f"traced with bf16 weights and KV cache (plan: {plan.weight_format} weights, "
                     f"{plan.kv_dtype} KV); compare transients, not weights")
    start = time.perf_counter()
    torch.manual_seed(seed)
    tracker = LiveBytes()
    B, P = plan.concurrency, plan.prompt_len
    peaks: dict[str, tuple[int, int]] = {}
    fake_mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with fake_mode, tracker, torch.no_grad():
        from transformers import StaticCache

        model, cfg = serving_model(spec, num_layers)
        cache = StaticCache(config=cfg, max_cache_len=plan.context_len)
        ids = torch.randint(0, spec.vocab_size, (B, P))
        tracker.phase = "prefill"
        tracker.reset_peak()
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1, cache_position=torch.arange(P))
        peaks["prefill"] = (tracker.peak.bytes, tracker.peak.clock)
        nxt = out.logits[:, -1:].argmax(-1)
        del out, ids
        tracker.phase = "decode"
        tracker.reset_peak()
        out = model(input_ids=nxt, cache=cache, use_cache=True, logits_to_keep=1,
                    cache_position=torch.tensor([P]))
        peaks["decode"] = (tracker.peak.bytes, tracker.peak.clock)
        groups: dict[int, str] = {}
        for t in [*model.parameters(), *model.buffers()]:
            rec = tracker.record_of(t)
            if rec is not None:
                groups[rec.uid] = "weights"
        for t in cache_tensors(cache):  # keys and values, latents, conv and recurrent states
            rec = tracker.record_of(t)
            if rec is not None:
                groups[rec.uid] = "kv_cache"
        phases = {}
        for phase, (nbytes, clock) in peaks.items():
            ledger = {"weights": 0, "kv_cache": 0, "transient": 0}
            for rec in tracker.live_at(clock):
                ledger[groups.get(rec.uid, "transient")] += rec.nbytes
            phases[phase] = PhasePeak(phase, nbytes, ledger)
        layers = cfg.num_hidden_layers
        del out, model, cache
    return ServeTrace(num_layers=layers, prefill=phases["prefill"], decode=phases["decode"],
                      seconds=time.perf_counter() - start, fake=fake, notes=notes)


def layer_period(spec: ModelSpec) -> tuple[int, int]:
    """(prefix, period) of the model's layer kinds: after ``prefix`` layers (DeepSeek's dense first layer) the kinds
    repeat every ``period`` layers (gpt-oss's sliding/full pair: 2; Gemma-3's five sliding then one full: 6;
    Qwen3-Next's three Gated DeltaNet then one full: 4). A dense model is (0, 1)."""
    kinds = spec.description.layer_kinds()
    pattern = [0] * spec.num_layers
    for k, (_, indices) in enumerate(kinds):
        for i in indices:
            pattern[i] = k
    L = len(pattern)
    for prefix in range(L):
        rest = pattern[prefix:]
        for period in range(1, len(rest) + 1):
            if all(rest[i] == rest[i % period] for i in range(len(rest))):
                if period < len(rest):
                    return prefix, period
                break
    return 0, L


def trace_serving_extrapolated(spec: ModelSpec, plan: ServePlan, *, depths: tuple[int, int] | None = None,
                               fake: bool = True) -> ServeTrace:
    """Trace two depths one period of layer kinds apart and extend linearly to the model's depth: weights and the
    cache grow by one period's share per period; the transient peak (one layer's working set, the logits) does not
    depend on depth. Both depths keep the model's remainder layers (L - prefix mod period), so the extension adds
    whole periods only (``layer_period``); a model too shallow for two periods is traced at full depth."""
    L = spec.num_layers
    if depths is None:
        prefix, period = layer_period(spec)
        rem = (L - prefix) % period
        a, b = prefix + period + rem, prefix + 2 * period + rem
        if period == 1:
            a, b = max(a, 2), max(b, 3)
    else:
        a, b = depths
        period = b - a
    if b >= L:
        full = trace_serving(spec, plan, fake=fake)
        return full
    ta = trace_serving(spec, plan, fake=fake, num_layers=a)
    tb = trace_serving(spec, plan, fake=fake, num_layers=b)
    periods = (L - b) / (b - a)

    def extend(pa: PhasePeak, pb: PhasePeak) -> PhasePeak:
        ledger = {}
        for k in pb.ledger:
            ledger[k] = int(round(pb.ledger[k] + (pb.ledger[k] - pa.ledger[k]) * periods))
        return PhasePeak(pb.phase, sum(ledger.values()), ledger)

    return ServeTrace(num_layers=L, prefill=extend(ta.prefill, tb.prefill), decode=extend(ta.decode, tb.decode),
                      seconds=ta.seconds + tb.seconds, fake=fake,
                      notes=[*tb.notes, f"extrapolated linearly from {a} and {b} layers"])
