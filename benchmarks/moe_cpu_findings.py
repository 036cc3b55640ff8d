"""What transformers 5, bitsandbytes and peft really do with mixtures of experts and the new attention
schemes, found by running them on tiny models on the CPU (issue 24, groundwork). Prints the tables of
reports/moe_findings.md.

Sections (``--section``, default all):

- ``layout``:  the parameters of tiny Qwen3-MoE, gpt-oss, Mixtral, OLMoE, DeepSeek-V2, Gemma-3 (text) and
  Qwen3-Next models, classified (nn.Linear, stacked experts, router, norms, the rest); the real-size
  configs' exact parameter counts from a meta-device build (advisor.core.architecture), their cache per
  token and the build's seconds.
- ``quant``:   bitsandbytes 4-bit (nf4) and 8-bit loading through ``from_pretrained`` of a tiny model saved
  to a temporary directory: which parameters become Params4bit / Int8Params and the bytes by category;
  gpt-oss's MXFP4 checkpoint layout loaded on the CPU (no triton, no kernels); what that means at real size.
- ``peft``:    LoRA on attention, ``all-linear`` and ``target_parameters`` on the stacked experts, alone and
  on a 4-bit model: what gets adapters, their shapes, trainable counts, one AdamW step in fp32 and bf16.
- ``memory``:  one real training step (warm-up, then the measured step) under the project's live-bytes
  tracker (advisor.runtime.simulate.tracker), on real tensors and under FakeTensorMode, for full, LoRA
  (attention), LoRA with target_parameters on the experts and QLoRA (bitsandbytes from_pretrained on real
  tensors, the project's 4-bit stand-in under fake tensors), with and without gradient checkpointing;
  the experts implementations (grouped_mm, eager, batched_mm, the pre-SM80 fallback) and routing seeds.
- ``describe``: advisor.core.architecture against architectures.yaml + catalog.py for every dense catalog
  model; the time a meta build takes for a 7B and a 30B-A3B config in a fresh process.

Run: python benchmarks/moe_cpu_findings.py [--section layout|quant|peft|memory|describe] [--quick]
(about 10 minutes on 2 CPU cores for everything; --quick runs two models per section).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# --------------------------------------------------------------------------- configs

TINY = {
    # a few layers, hidden 128, 8 experts top-2: expert stacks dominate, as at real size
    "qwen3_moe": dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                      num_experts_per_tok=2, vocab_size=512),
    "gpt_oss": dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2, vocab_size=512,
                    sliding_window=32, layer_types=["sliding_attention", "full_attention"]),
    "mixtral": dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=512),
    "olmoe": dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, vocab_size=512, eos_token_id=1,
                  pad_token_id=0),
    "deepseek_v2": dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None,
                        qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, vocab_size=512, n_group=1,
                        topk_group=1),
    "qwen3_next": dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                       shared_expert_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2, vocab_size=512,
                       linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=32,
                       linear_value_head_dim=32, linear_conv_kernel_dim=4),
    "gemma3_text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=32, vocab_size=512, sliding_window=32),
}
"""Tiny configs (random weights): the model classes of transformers 5.24, built from their config class."""

_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "original_max_position_embeddings": 4096, "truncate": False}
_GEMMA3_ROPE = {"factor": 8.0, "rope_type": "linear"}
REAL = {
    # hub id: (config.json architecture fields, source)
    "Qwen/Qwen3-30B-A3B": (dict(
        model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
        tie_word_embeddings=False, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0),
        "huggingface.co/Qwen/Qwen3-30B-A3B config.json (values as copied verbatim in public repositories)"),
    "Qwen/Qwen3-235B-A22B": (dict(
        model_type="qwen3_moe", hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
        num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
        tie_word_embeddings=False, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0),
        "huggingface.co/Qwen/Qwen3-235B-A22B config.json (layers, widths, experts as in slime's "
        "scripts/models/qwen3-235B-A22B.sh)"),
    "openai/gpt-oss-20b": (dict(
        model_type="gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
        vocab_size=201088, sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 12,
        attention_bias=True, tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5,
        swiglu_limit=7.0, rope_scaling=_GPT_OSS_ROPE, rope_theta=150000),
        "huggingface.co/openai/gpt-oss-20b config.json (the 120b's with 24 layers and 32 experts)"),
    "openai/gpt-oss-120b": (dict(
        model_type="gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128, num_experts_per_tok=4,
        vocab_size=201088, sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 18,
        attention_bias=True, tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5,
        swiglu_limit=7.0, rope_scaling=_GPT_OSS_ROPE, rope_theta=150000),
        "huggingface.co/openai/gpt-oss-120b/raw/main/config.json"),
    "mistralai/Mixtral-8x7B-v0.1": (dict(
        model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
        vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=1000000.0, sliding_window=None),
        "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json"),
    "allenai/OLMoE-1B-7B-0924": (dict(
        model_type="olmoe", hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, vocab_size=50304,
        tie_word_embeddings=False, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
        norm_topk_prob=False),
        "huggingface.co/allenai/OLMoE-1B-7B-0924 config.json (the -0125-Instruct's has the same fields)"),
    "deepseek-ai/DeepSeek-V2-Lite": (dict(
        model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64,
        n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=512,
        q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=102400,
        tie_word_embeddings=False, max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000,
        n_group=1, topk_group=1, topk_method="greedy", routed_scaling_factor=1.0),
        "huggingface.co/deepseek-ai/DeepSeek-V2-Lite config.json"),
    "google/gemma-3-1b-pt": (dict(
        model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512,
        query_pre_attn_scalar=256, tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_local_base_freq=10000.0),
        "huggingface.co/google/gemma-3-1b-pt config.json (Gemma3ForCausalLM, text only)"),
    "google/gemma-3-4b-pt": (dict(
        model_type="gemma3_text", hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=262208, sliding_window=1024,
        query_pre_attn_scalar=256, tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_scaling=_GEMMA3_ROPE),
        "huggingface.co/google/gemma-3-4b-pt config.json text_config (vocab_size: Gemma3TextConfig's 262208)"),
    "google/gemma-3-12b-pt": (dict(
        model_type="gemma3_text", hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=262208, sliding_window=1024,
        query_pre_attn_scalar=256, tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_scaling=_GEMMA3_ROPE),
        "huggingface.co/google/gemma-3-12b-pt config.json text_config"),
    "google/gemma-3-27b-pt": (dict(
        model_type="gemma3_text", hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
        num_attention_heads=32, num_key_value_heads=16, head_dim=128, vocab_size=262208, sliding_window=1024,
        query_pre_attn_scalar=168, tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_scaling=_GEMMA3_ROPE),
        "huggingface.co/google/gemma-3-27b-pt config.json text_config"),
    "Qwen/Qwen3-Next-80B-A3B-Instruct": (dict(
        model_type="qwen3_next", hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2,
        head_dim=256, num_experts=512, num_experts_per_tok=10, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], full_attention_interval=4, linear_num_value_heads=32, linear_num_key_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
        vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=262144, rms_norm_eps=1e-6,
        rope_theta=10000000),
        "huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct config.json"),
}
"""Real-size configs: the architecture fields of each model's published config.json."""

QUICK = ("qwen3_moe", "gpt_oss")
GIB = 2**30


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    import logging

    for name in ("transformers", "bitsandbytes", "peft", "torch", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def hf_config(model_type: str, fields: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **fields)


def table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


# --------------------------------------------------------------------------- models, adapters, quantization


def parameter_kind(model, name: str, param) -> str:
    """nn.Linear / stacked experts / router / norm / other, by the module that holds the parameter."""
    import torch

    module = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    cls = type(module).__name__
    if isinstance(module, torch.nn.Linear):
        return f"{cls}"
    if isinstance(module, torch.nn.Embedding):
        return "Embedding"
    if param.dim() == 3 and not isinstance(module, torch.nn.modules.conv._ConvNd) or "Experts" in cls:
        return f"stacked experts ({cls})"
    if "Norm" in cls:
        return f"norm ({cls})"
    if "Router" in cls:
        return f"router ({cls})"
    return f"other ({cls})"


def attention_linears(model) -> list[str]:
    """Short names of the nn.Linear modules of the layers' attention (q/k/v/o, MLA's, Gated DeltaNet's)."""
    import torch

    from advisor.core.architecture import ATTENTION_PREFIXES, decoder_layers

    names = set()
    for layer in decoder_layers(model):
        for n, m in layer.named_modules():
            if isinstance(m, torch.nn.Linear) and n.split(".")[0] in ATTENTION_PREFIXES:
                names.add(n.rsplit(".", 1)[-1])
    return sorted(names)


def expert_parameters(model) -> list[str]:
    """``experts.<name>`` of every 3-D stacked expert weight (what LoraConfig.target_parameters names)."""
    from advisor.core.architecture import decoder_layers

    names = set()
    for layer in decoder_layers(model):
        for n, p in layer.named_parameters():
            if p.dim() == 3 and ".experts." in f".{n}":
                names.add("experts." + n.rsplit(".", 1)[-1])
    return sorted(names)


@contextlib.contextmanager
def module_to_is_noop():
    """peft moves new adapters with Module.to, which cannot swap fake parameters (advisor.runtime.build)."""
    import torch

    original = torch.nn.Module.to
    torch.nn.Module.to = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.nn.Module.to = original


_SAVED_DIRS: dict = {}
_TEMP_DIRS: list[str] = []


def _temp_dir(prefix: str) -> str:
    """A temporary directory removed when the benchmark exits."""
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix=prefix)
    if not _TEMP_DIRS:
        atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _TEMP_DIRS])
    _TEMP_DIRS.append(folder)
    return folder


def saved_checkpoint(model_type: str, fields: dict, seed: int = 0) -> str:
    """A tiny bf16 checkpoint of ``model_type`` in a temporary directory (made once per config and seed)."""
    import torch
    from transformers import AutoModelForCausalLM

    key = (model_type, json.dumps(fields, sort_keys=True), seed)
    if key not in _SAVED_DIRS:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_config(model_type, fields), dtype=torch.bfloat16)
        folder = _temp_dir(f"moe_{model_type}_")
        model.save_pretrained(folder)
        _SAVED_DIRS[key] = folder
    return _SAVED_DIRS[key]


def load_bnb(model_type: str, fields: dict, bits: int, seed: int = 0):
    """from_pretrained of the tiny checkpoint with BitsAndBytesConfig (nf4 / LLM.int8), on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    q = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
         if bits == 4 else BitsAndBytesConfig(load_in_8bit=True))
    return AutoModelForCausalLM.from_pretrained(saved_checkpoint(model_type, fields, seed), quantization_config=q,
                                                dtype=torch.bfloat16, device_map="cpu")


def quantize_with_standins(model) -> None:
    """What BitsAndBytesConfig(load_in_4bit, nf4) does to a model, with the project's fake-tensor-friendly
    stand-in (advisor.runtime.simulate.standins): every module whose type is exactly nn.Linear and is not
    in transformers' get_keys_to_not_convert (bitsandbytes.py replace_with_bnb_linear)."""
    import torch
    from transformers.quantizers.base import get_keys_to_not_convert

    from advisor.runtime.simulate.standins import _classes

    standin4, _ = _classes()
    skip = set(get_keys_to_not_convert(model))
    for name, module in list(model.named_modules()):
        if type(module) is torch.nn.Linear and name not in skip:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, standin4(module, "nf4", False, torch.bfloat16))
    model.is_loaded_in_4bit = True
    model.is_quantized = True


def build_setup(model_type: str, fields: dict, method: str, *, checkpointing: bool, fake: bool, rank: int = 8,
                experts_impl: str | None = None, seed: int = 0, dtype: str = "bfloat16"):
    """(model, optimizer) for one plan: full / lora (attention) / lora-experts (attention + target_parameters on
    the stacked experts) / qlora (4-bit base + the same adapters as lora-experts)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    extra = {"experts_implementation": experts_impl} if experts_impl else {}
    if method == "qlora" and not fake:
        model = load_bnb(model_type, fields, 4, seed)
        if experts_impl:
            model.set_experts_implementation(experts_impl)
    else:
        model = AutoModelForCausalLM.from_config(hf_config(model_type, fields), dtype=getattr(torch, dtype), **extra)
        if method == "qlora":
            quantize_with_standins(model)
    for p in model.parameters():
        p.requires_grad_(method == "full")
    if checkpointing:
        # what Trainer does for gradient_checkpointing=True in transformers 5 (advisor.runtime.build)
        model.activation_checkpointing_enable()
    if method != "full":
        experts = expert_parameters(model) if method in ("lora-experts", "qlora") else []
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=attention_linears(model),
                            target_parameters=experts or None)
        with module_to_is_noop() if fake else contextlib.nullcontext():
            model = get_peft_model(model, config)
        if fake:  # .to was skipped: peft's autocast_adapter_dtype by hand (fp32 adapters)
            for p in model.parameters():
                if p.requires_grad and p.dtype != torch.float32:
                    p.data = p.data.float()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=False)
    return model, optimizer


def train_step(model, optimizer, ids, phase=None):
    """Forward with labels (the model's causal-LM loss, plus the router's aux loss where configured), backward,
    AdamW step, zero_grad(set_to_none=True)."""
    if phase:
        phase("forward")
    loss = model(input_ids=ids, labels=ids).loss
    if phase:
        phase("backward")
    loss.backward()
    if phase:
        phase("optimizer")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if phase:
        phase("end")
    return loss.detach()


# --------------------------------------------------------------------------- the measured step


def measure_step(model_type: str, fields: dict, method: str, *, checkpointing: bool = False, fake: bool = False,
                 batch: int = 2, seq: int = 64, experts_impl: str | None = None, seed: int = 0) -> dict:
    """Peak live bytes of the measured step (after a warm-up step) and the ledger at the peak.

    The tracker is the project's (advisor.runtime.simulate.tracker.LiveBytes: every storage rounded to
    512 B); categories by identity after the step: weights, quant_constants, trainable, gradients,
    optimizer_states; activations by autograd's saved-tensor hook; the rest is transient."""
    import torch
    from torch._subclasses import FakeTensorMode

    from advisor.runtime.simulate.runner import cuda_semantics
    from advisor.runtime.simulate.standins import quant_constant_tensors
    from advisor.runtime.simulate.tracker import LiveBytes

    start = time.perf_counter()
    tracker = LiveBytes()
    saved: set[int] = set()

    def pack(t):
        rec = tracker.record_of(t)
        if rec is not None:
            saved.add(rec.uid)
        return t

    peaks: dict[str, tuple[int, int]] = {}
    state = {"phase": "warm-up", "measuring": False}

    def phase(name):
        if state["measuring"] and state["phase"] in ("forward", "backward", "optimizer"):
            best = peaks.get(state["phase"])
            if best is None or tracker.peak.bytes > best[0]:
                peaks[state["phase"]] = (tracker.peak.bytes, tracker.peak.clock)
        state["phase"] = name
        tracker.phase = name
        tracker.reset_peak()

    with cuda_semantics(), FakeTensorMode() if fake else contextlib.nullcontext():
        model, optimizer = build_setup(model_type, fields, method, checkpointing=checkpointing, fake=fake,
                                       experts_impl=experts_impl, seed=seed)
        for t in [*model.parameters(), *model.buffers(), *quant_constant_tensors(model)]:
            tracker.track(t)
        vocab = fields["vocab_size"]
        ids = (torch.zeros(batch, seq, dtype=torch.long) if fake
               else torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed)))
        grads: set[int] = set()

        def mark_grad(p):
            rec = tracker.record_of(p.grad)
            if rec is not None:
                grads.add(rec.uid)

        with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            train_step(model, optimizer, ids)  # warm-up: optimizer states exist afterwards
            baseline = tracker.live_bytes
            state["measuring"] = True
            hooks = [p.register_post_accumulate_grad_hook(mark_grad) for p in model.parameters() if p.requires_grad]
            loss = train_step(model, optimizer, ids, phase)
            for h in hooks:
                h.remove()
        groups: dict[int, str] = {}
        for t in quant_constant_tensors(model):
            if (rec := tracker.record_of(t)) is not None:
                groups[rec.uid] = "quant_constants"
        for p in model.parameters():
            if (rec := tracker.record_of(p)) is not None:
                groups.setdefault(rec.uid, "trainable" if p.requires_grad else "weights")
        for b in model.buffers():
            if (rec := tracker.record_of(b)) is not None:
                groups.setdefault(rec.uid, "weights")
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and (rec := tracker.record_of(v)) is not None:
                    groups.setdefault(rec.uid, "optimizer_states")
        for uid in grads:
            groups.setdefault(uid, "gradients")
        for uid in saved:
            groups.setdefault(uid, "activations")
        ledgers = {}
        for ph, (nbytes, clock) in peaks.items():
            ledger: dict[str, int] = {}
            for rec in tracker.live_at(clock):
                cat = groups.get(rec.uid, "transient")
                ledger[cat] = ledger.get(cat, 0) + rec.nbytes
            ledgers[ph] = (nbytes, ledger)
        top = max(ledgers, key=lambda k: ledgers[k][0])
        largest = sorted(((r.nbytes, groups.get(r.uid, "transient"), r.op) for r in tracker.live_at(peaks[top][1])
                          if groups.get(r.uid) != "weights"), reverse=True)[:4]
    return dict(peak=ledgers[top][0], phase=top, ledger=ledgers[top][1], baseline=baseline,
                loss=None if fake else float(loss), seconds=time.perf_counter() - start, largest=largest)


# --------------------------------------------------------------------------- sections


def section_layout(models: list[str]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.core.architecture import describe_architecture

    print("## 1. Parameter layout (tiny models, transformers", _version("transformers"), ")\n")
    for mt in models:
        model = AutoModelForCausalLM.from_config(hf_config(mt, TINY[mt]), dtype=torch.bfloat16)
        rows = []
        seen_kinds = set()
        for name, p in model.named_parameters():
            layer = name.split(".")[2] if name.startswith("model.layers.") else None
            if layer not in (None, "0", "1", "3", "5"):
                continue
            kind = parameter_kind(model, name, p)
            short = name if layer is None else "layers.N." + name.split(".", 3)[3]
            if (short, kind, tuple(p.shape)) in seen_kinds:
                continue
            seen_kinds.add((short, kind, tuple(p.shape)))
            rows.append([short, kind, tuple(p.shape), str(p.dtype).replace("torch.", "")])
        d = describe_architecture({"model_type": mt, **TINY[mt]})
        kinds = [layer.attention + (f"({layer.sliding_window})" if layer.sliding_window else "") for layer in d.layers]
        print(f"### {type(model).__name__} (experts implementation: {model.config._experts_implementation}, "
              f"attention: {model.config._attn_implementation}; layers: {', '.join(kinds)})\n")
        print(table(["parameter", "held by", "shape", "dtype"], rows))
        print()
    print("### Real-size configs: meta-device build (advisor.core.architecture.describe_architecture)\n")
    rows = []
    for hub, (fields, _source) in REAL.items():
        d = describe_architecture(fields)
        c = d.params_by_category
        kinds: dict[str, int] = {}
        for layer in d.layers:
            k = layer.attention + (f"({layer.sliding_window})" if layer.sliding_window else "")
            kinds[k] = kinds.get(k, 0) + 1
        rows.append([hub, d.params_total, c["experts"], c["attention"], c["mlp"] + c["shared_experts"], c["router"],
                     c["embedding"] + c["lm_head"], ", ".join(f"{k} x{v}" for k, v in kinds.items()),
                     d.kv_bytes_per_token_uncapped(), mib(d.kv_cache_bytes(32768)),
                     f"{d.build_seconds:.2f} + {d.cache_seconds:.2f}"])
    print(table(["model", "params (meta build)", "experts", "attention", "dense MLP + shared", "router",
                 "embed + head", "layers", "cache B/token (uncapped)", "cache of one 32k sequence",
                 "build + cache probe s"], rows))
    print("\nSources of the configs:\n")
    for hub, (_fields, source) in REAL.items():
        print(f"- {hub}: {source}")
    print()


def _bytes_by_category(model) -> dict[str, int]:
    import bitsandbytes as bnb
    import torch

    out: dict[str, int] = {}
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            size = p.numel() * p.element_size()
            if isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)) and pname == "weight":
                cat = "quantized linear (" + type(p).__name__ + ")"
            elif p.dim() == 3 and not isinstance(module, torch.nn.modules.conv._ConvNd):
                cat = f"stacked experts ({p.dtype})".replace("torch.", "")
            elif isinstance(module, torch.nn.Embedding) or name == "lm_head":
                cat = "embedding / lm_head"
            else:
                cat = "other (" + str(p.dtype).replace("torch.", "") + ")"
            out[cat] = out.get(cat, 0) + size
        if isinstance(module, bnb.nn.Linear4bit):
            qs = module.weight.quant_state
            out["4-bit constants (absmax, code)"] = out.get("4-bit constants (absmax, code)", 0) + sum(
                t.numel() * t.element_size() for t in (qs.absmax, qs.code))
        if isinstance(module, bnb.nn.Linear8bitLt):
            scb = module.weight.SCB if module.weight.SCB is not None else module.state.SCB
            if scb is not None:
                out["8-bit constants (SCB)"] = out.get("8-bit constants (SCB)", 0) + scb.numel() * scb.element_size()
    return out


def section_quant(models: list[str]) -> None:
    import torch

    print("## 2. Quantized loading (bitsandbytes", _version("bitsandbytes"), "on the CPU)\n")
    rows = []
    for mt in models:
        for bits in (4, 8):
            model = load_bnb(mt, TINY[mt], bits)
            converted = sorted({type(m).__name__ for m in model.modules()
                                if type(m).__name__ in ("Linear4bit", "Linear8bitLt")})
            kept = sorted({n.split(".", 3)[3].rsplit(".", 1)[0] for n, m in model.named_modules()
                           if type(m) is torch.nn.Linear and n.startswith("model.layers.")})
            experts = sorted({f"{n.rsplit('.', 1)[-1]} {str(p.dtype).replace('torch.', '')}"
                              for n, p in model.named_parameters() if p.dim() == 3 and ".experts." in n})
            cats = _bytes_by_category(model)
            ids = torch.randint(0, TINY[mt]["vocab_size"], (1, 16))
            try:
                ok = "yes" if torch.isfinite(model(input_ids=ids, labels=ids).loss).item() else "NaN loss"
            except Exception as e:  # noqa: BLE001 - reported as found
                where = next((f"{fr.name} ({Path(fr.filename).name}:{fr.lineno})" for fr in reversed(
                    __import__("traceback").extract_tb(e.__traceback__)) if "modeling_" in fr.filename), "")
                ok = f"FAILS: {type(e).__name__}: {str(e)[:90]} in {where}"
            rows.append([mt, f"{bits}-bit", ", ".join(converted), ", ".join(experts) or "-", ", ".join(kept) or "-",
                         "; ".join(f"{k}: {v:,}" for k, v in sorted(cats.items())), ok])
    print(table(["model", "load", "linear modules became", "stacked experts after loading",
                 "decoder nn.Linear left unquantized", "bytes by category", "forward runs"], rows))
    print()
    section_mxfp4()
    section_real_size_weights()


def section_mxfp4() -> None:
    """gpt-oss's MXFP4 checkpoint layout (``*_blocks`` uint8 (E, out, in/32, 16), ``*_scales`` uint8 (E, out,
    in/32): 32 FP4 values and one E8M0 scale per block) loaded on this CPU, without triton and kernels."""
    import importlib.util

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, Mxfp4Config

    mt = "gpt_oss"
    model = AutoModelForCausalLM.from_config(hf_config(mt, TINY[mt]), dtype=torch.bfloat16)
    folder = _temp_dir("moe_mxfp4_")
    state = {}
    for k, v in model.state_dict().items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            n_exp, n_in, n_out = v.shape  # GptOssExperts stores (E, in, out); the checkpoint (E, out, in/32, 16)
            g = torch.Generator().manual_seed(0)
            state[k + "_blocks"] = torch.randint(0, 256, (n_exp, n_out, n_in // 32, 16), dtype=torch.uint8, generator=g)
            state[k + "_scales"] = torch.full((n_exp, n_out, n_in // 32), 127, dtype=torch.uint8)
        else:
            state[k] = v.contiguous()
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    packed = sum(v.numel() * v.element_size() for k, v in state.items() if k.endswith(("_blocks", "_scales")))
    rows = []
    for label, kwargs in (("checkpoint's own quantization_config", {}),
                          ("Mxfp4Config(dequantize=True)", {"quantization_config": Mxfp4Config(dequantize=True)})):
        try:
            loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, device_map="cpu", **kwargs)
            ex = loaded.model.layers[0].mlp.experts
            after = sum(p.numel() * p.element_size() for layer in loaded.model.layers
                        for n, p in layer.mlp.experts.named_parameters() if p.dim() == 3)
            rows.append([label, type(ex).__name__, ", ".join(f"{n} {tuple(p.shape)} {str(p.dtype)[6:]}"
                                                            for n, p in ex.named_parameters() if p.dim() == 3),
                         packed, after, f"{after / packed:.2f}x"])
        except Exception as e:  # noqa: BLE001 - reported as found
            rows.append([label, f"FAILED: {type(e).__name__}: {str(e)[:120]}", "", packed, "", ""])
    try:
        plain = saved_checkpoint(mt, TINY[mt])
        AutoModelForCausalLM.from_pretrained(plain, dtype=torch.bfloat16, device_map="cpu",
                                             quantization_config=Mxfp4Config())
        on_the_fly = "loaded"
    except Exception as e:  # noqa: BLE001
        on_the_fly = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    print("### gpt-oss MXFP4 on the CPU (triton installed: "
          f"{importlib.util.find_spec('triton') is not None}, kernels installed: "
          f"{importlib.util.find_spec('kernels') is not None})\n")
    print(table(["load", "experts module", "expert weights after loading", "MXFP4 bytes in checkpoint",
                 "bytes after loading", "growth"], rows))
    print(f"\nQuantizing a bf16 checkpoint with Mxfp4Config() on this machine: {on_the_fly}\n")


def section_real_size_weights() -> None:
    """Weight bytes at real size, from the meta-device description: what bitsandbytes converts (every
    decoder nn.Linear, not the stacked experts) and what stays bf16."""
    from advisor.core.architecture import describe_architecture

    rows = []
    for hub, (fields, _s) in REAL.items():
        d = describe_architecture(fields, with_cache=False)
        if not d.is_moe:
            continue
        quantizable = sum(m.in_features * m.out_features for layer in d.layers for m in layer.linears
                          if m.quantized_by_bnb)
        rest = d.params_total - quantizable
        experts = d.params_by_category["experts"]
        bf16 = 2 * d.params_total
        # nf4: 0.5 B per value + one fp32 absmax per 64 values (QLoRA §3; BitsAndBytesConfig default blocksize)
        nf4 = quantizable * 0.5 + quantizable / 64 * 4 + rest * 2
        int8 = quantizable * 1 + rest * 2  # + one fp32 SCB per output row (small)
        # the same with the experts in nf4 too (what a 4-bit expert kernel would need: not in transformers/bnb)
        nf4_all = (quantizable + experts) * (0.5 + 4 / 64) + (rest - experts) * 2
        # MXFP4: 4 bits + one 8-bit scale per 32 values on the experts (gpt-oss's checkpoint format)
        mx = experts * (0.5 + 1 / 32) + (d.params_total - experts) * 2 if d.model_type == "gpt_oss" else None
        rows.append([hub, d.params_total, f"{experts / d.params_total:.1%}", gib(bf16), gib(nf4), gib(int8),
                     gib(nf4_all), gib(mx) if mx else "-"])
    print("### Weight bytes at real size (meta-device description; bytes, not allocator blocks)\n")
    print(table(["model", "params", "in stacked experts", "bf16", "bnb 4-bit as transformers loads it",
                 "bnb 8-bit as transformers loads it", "if the experts were nf4 too", "MXFP4 experts (kept)"], rows))
    print()


def section_peft(models: list[str]) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    print("## 3. peft", _version("peft"), "on the stacked experts\n")
    rows = []
    for mt in models:
        if mt == "gemma3_text":
            continue
        base = AutoModelForCausalLM.from_config(hf_config(mt, TINY[mt]), dtype=torch.bfloat16)
        attn = attention_linears(base)
        experts = expert_parameters(base)
        variants = [
            ("attention", dict(target_modules=attn)),
            ("all-linear", dict(target_modules="all-linear")),
            ("gate_proj/up_proj/down_proj (v4 names)", dict(target_modules=["gate_proj", "up_proj", "down_proj"])),
            ("target_parameters=experts", dict(target_modules=[], target_parameters=experts)),
            ("4-bit + attention + target_parameters", dict(target_modules=attn, target_parameters=experts)),
        ]
        for label, kwargs in variants:
            for dtype in ("float32", "bfloat16"):
                if label.startswith("4-bit") and dtype == "float32":
                    continue
                torch.manual_seed(0)
                try:
                    if label.startswith("4-bit"):
                        model = load_bnb(mt, TINY[mt], 4)
                    else:
                        model = AutoModelForCausalLM.from_config(hf_config(mt, TINY[mt]), dtype=getattr(torch, dtype))
                    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, **kwargs)
                    pm = get_peft_model(model, config)
                except Exception as e:  # noqa: BLE001 - reported as found
                    rows.append([mt, label, dtype, f"FAILED: {type(e).__name__}: {str(e)[:150]}", "", "", "", ""])
                    continue
                pm.train()  # as Trainer does (from_pretrained returns the model in eval mode)
                c = pm.peft_config["default"]
                trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
                wrapped = sorted({n.split(".layers.")[1].split(".", 1)[1].rsplit(".lora_", 1)[0].replace(
                    ".base_layer", "") for n, p in pm.named_parameters()
                    if p.requires_grad and ".layers." in n and "lora_A" in n})
                expert_shapes = param_wrapper_shapes(pm)
                opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-3)
                ids = torch.randint(0, TINY[mt]["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(0))
                try:
                    l0 = pm(input_ids=ids, labels=ids).loss
                    l0.backward()
                    opt.step()
                    opt.zero_grad()
                    l1 = pm(input_ids=ids, labels=ids).loss
                    step = f"ok {float(l0):.4f} -> {float(l1):.4f}"
                except Exception as e:  # noqa: BLE001
                    step = f"FAILED: {type(e).__name__}: {str(e)[:120]}"
                pattern = ", ".join(f"{k}: r={v}" for k, v in (c.rank_pattern or {}).items())
                rows.append([mt, label, dtype, ", ".join(sorted(c.target_parameters or [])) or "-",
                             ", ".join(wrapped), trainable, "; ".join(expert_shapes) or "-",
                             (pattern + "; " if pattern else "") + step])
    print(table(["model", "LoraConfig", "dtype", "target_parameters after peft", "wrapped in a layer", "trainable",
                 "ParamWrapper adapters (first MoE layer)", "rank pattern; one AdamW step"], rows))
    print()


def param_wrapper_shapes(model) -> list[str]:
    """``parameter: lora_A (rows, cols) / lora_B (rows, cols)`` of each peft ParamWrapper in the first MoE layer."""
    seen: dict[str, str] = {}
    for name, module in model.named_modules():
        if type(module).__name__ != "ParamWrapper" or ".layers." not in name:
            continue
        layer = name.split(".layers.")[1].split(".")[0]
        key = module.parameter_name if module.parameter_name != "weight" else name.rsplit(".", 1)[-1] + ".weight"
        if key in seen or (seen and layer != seen.get("_layer")):
            continue
        seen.setdefault("_layer", layer)
        a = tuple(module.lora_A["default"].weight.shape)
        b = tuple(module.lora_B["default"].weight.shape)
        seen[key] = f"{key}: A {a} / B {b}"
    return [v for k, v in seen.items() if k != "_layer"]


def section_memory(models: list[str]) -> None:
    print("## 4. One training step under the live-bytes tracker: real tensors vs FakeTensorMode\n")
    print("batch 2 x 64 tokens, AdamW, bf16 base, LoRA r=8 fp32 adapters (peft's autocast_adapter_dtype); "
          "QLoRA: real = bitsandbytes from_pretrained, fake = the project's 4-bit stand-in.\n")
    rows = []
    for mt in models:
        methods = ("full", "lora", "qlora") if mt == "gemma3_text" else ("full", "lora", "lora-experts", "qlora")
        for method in methods:
            for ckpt in (False, True):
                real = measure_step(mt, TINY[mt], method, checkpointing=ckpt, fake=False)
                try:
                    fake = measure_step(mt, TINY[mt], method, checkpointing=ckpt, fake=True)
                    fake_peak, diff = fake["peak"], fake["peak"] - real["peak"]
                    same = fake["ledger"] == real["ledger"] and fake["phase"] == real["phase"]
                except Exception as e:  # noqa: BLE001 - reported as found
                    fake_peak, diff, same = f"FAILED {type(e).__name__}", "", False
                led = real["ledger"]
                rows.append([mt, method, "yes" if ckpt else "no", real["peak"], fake_peak, diff,
                             "yes" if same else "NO", real["phase"], led.get("weights", 0) + led.get(
                                 "quant_constants", 0), led.get("trainable", 0), led.get("optimizer_states", 0),
                             led.get("gradients", 0), led.get("activations", 0), led.get("transient", 0)])
                print(f"  {mt} {method} ckpt={ckpt}: {real['peak']:,} / {fake_peak}", file=sys.stderr, flush=True)
    print(table(["model", "method", "ckpt", "real peak B", "fake peak B", "fake - real", "same ledger", "peak in",
                 "weights+consts", "trainable", "optimizer", "gradients", "activations", "transient"], rows))
    print()
    section_experts_impl()
    section_expert_lora_scaling()
    section_router_and_attention()


def section_experts_impl() -> None:
    import transformers.integrations.moe as moe

    mt = "qwen3_moe"
    rows = []
    for method in ("lora", "lora-experts", "full"):
        for impl in ("grouped_mm", "eager", "batched_mm", "fallback (pre-SM80)"):
            original = moe._can_use_grouped_mm
            if impl.startswith("fallback"):
                moe._can_use_grouped_mm = lambda *a, **k: False  # what CUDA capability < 8.0 takes
            try:
                use = None if impl.startswith("fallback") else impl
                peaks = [measure_step(mt, TINY[mt], method, experts_impl=use, seed=s)["peak"] for s in (0, 1, 2)]
                try:
                    fake = measure_step(mt, TINY[mt], method, experts_impl=use, fake=True)["peak"]
                except Exception as e:  # noqa: BLE001
                    fake = f"FAILED {type(e).__name__}"
            finally:
                moe._can_use_grouped_mm = original
            rows.append([method, impl, ", ".join(f"{p:,}" for p in peaks), fake])
    print("### Experts implementations and routing (tiny Qwen3-MoE, three routing seeds on real tensors)\n")
    print(table(["method", "experts implementation", "real peak B, seeds 0 / 1 / 2", "fake peak B"], rows))
    print()
    print("Backward of one grouped expert matmul with a frozen expert stack (8 x 256 x 128 bf16, 524,288 B), "
          f"peak above live: {grouped_backward_extra()}\n")


def grouped_backward_extra() -> str:
    """The pre-SM80 fallback's backward makes grad_weight = zeros_like(weight) even for a frozen stack
    (transformers/integrations/moe.py _grouped_mm_fallback_bwd)."""
    import torch
    import transformers.integrations.moe as moe

    from advisor.runtime.simulate.tracker import LiveBytes

    def run(fallback: bool) -> int:
        n_exp, inter, hidden, tokens = 8, 128, 128, 256
        w = torch.randn(n_exp, 2 * inter, hidden, dtype=torch.bfloat16)
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
        offs = torch.cumsum(torch.full((n_exp,), tokens // n_exp, dtype=torch.int32), 0, dtype=torch.int32)
        tracker = LiveBytes()
        for t in (w, x, offs):
            tracker.track(t)
        original = moe._can_use_grouped_mm
        if fallback:
            moe._can_use_grouped_mm = lambda *a, **k: False
        try:
            with tracker:
                loss = moe._grouped_linear(x, w, offs).float().sum()
                base = tracker.live_bytes
                tracker.reset_peak()
                loss.backward()
        finally:
            moe._can_use_grouped_mm = original
        return tracker.peak.bytes - base

    return f"native grouped_mm {run(False):,} B, fallback {run(True):,} B"


def section_expert_lora_scaling() -> None:
    """LoRA on the experts through target_parameters: the extra saved bytes per layer against the stack sizes,
    for 8 and 16 experts (peft ParamWrapper folds W + s * A @ B into one baddbmm in W's dtype and grouped_mm
    saves that weight for backward)."""
    rows = []
    for n_exp in (8, 16):
        fields = dict(TINY["qwen3_moe"], num_experts=n_exp)
        lora = measure_step("qwen3_moe", fields, "lora")
        lx = measure_step("qwen3_moe", fields, "lora-experts")
        lora_c = measure_step("qwen3_moe", fields, "lora", checkpointing=True)
        lx_c = measure_step("qwen3_moe", fields, "lora-experts", checkpointing=True)
        h, i = fields["hidden_size"], fields["moe_intermediate_size"]
        stacks = n_exp * 2 * i * h * 2 + n_exp * h * i * 2
        layers = fields["num_hidden_layers"]
        extra_acts = lx["ledger"].get("activations", 0) - lora["ledger"].get("activations", 0)
        extra_peak_ckpt = lx_c["peak"] - lora_c["peak"]
        rows.append([n_exp, stacks, extra_acts, f"{extra_acts / layers / stacks:.2f}", extra_peak_ckpt,
                     lx["ledger"].get("trainable", 0) - lora["ledger"].get("trainable", 0)])
    print("### LoRA on the experts (target_parameters) vs attention-only LoRA, tiny Qwen3-MoE, 2 layers\n")
    print(table(["experts", "bf16 expert stacks of one layer B", "extra saved activations B (no ckpt)",
                 "per layer / stacks", "extra peak B (ckpt)", "extra trainable B"], rows))
    print()


def section_router_and_attention() -> None:
    """The load-balancing loss (off by default: every MoE config here has output_router_logits=False) and how
    saved activations grow with the sequence: gpt-oss runs eager attention (GptOssPreTrainedModel._supports_sdpa
    is False), so its softmax over (b, heads, s, s + 1) logits with the sinks is saved."""
    rows = []
    for aux in (False, True):
        fields = dict(TINY["qwen3_moe"], output_router_logits=aux)
        for method in ("lora", "full"):
            r = measure_step("qwen3_moe", fields, method)
            rows.append([f"qwen3_moe output_router_logits={aux}", method, r["peak"], r["ledger"].get("activations", 0),
                         f"{r['loss']:.4f}"])
    print("### The router's load-balancing loss (tiny Qwen3-MoE, batch 2 x 64)\n")
    print(table(["config", "method", "peak B", "saved activations B", "loss"], rows))
    print()
    rows = []
    for mt in ("gpt_oss", "qwen3_moe", "gemma3_text"):
        acts = {}
        for seq in (64, 128, 256):
            acts[seq] = measure_step(mt, TINY[mt], "lora", seq=seq)["ledger"].get("activations", 0)
        rows.append([mt, hf_attn(mt), acts[64], acts[128], acts[256], f"{acts[256] / acts[128]:.2f}"])
    print("### Saved activations of attention-only LoRA against the sequence (batch 2, no checkpointing)\n")
    print(table(["model", "attention", "seq 64 B", "seq 128 B", "seq 256 B", "256 / 128"], rows))
    print()


def hf_attn(model_type: str) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(model_type, TINY[model_type]))
    return model.config._attn_implementation


def section_describe() -> None:
    from advisor.core.architecture import describe_architecture
    from advisor.core.catalog import model_catalog, resolve_model
    from advisor.memory.inference import kv_cache_bytes_per_token

    print("## 5. The description derived from transformers vs architectures.yaml + catalog.py\n")
    rows = []
    for key in model_catalog():
        spec = resolve_model(key)
        d = describe_architecture(spec.config)
        first = d.layers[0]
        arch = spec.arch
        checks = {
            "linear shapes": first.linear_shapes() == spec.linear_shapes(),
            "biases": {m.short: m.out_features for m in first.linears if m.bias} == spec.layer_bias_params(),
            "norm params": first.norm_params == spec.layer_norm_params(),
            "norm count": first.norm_count == arch["norms_per_layer"] + (2 if arch.get("qk_norm") else 0),
            "params_total": d.params_total == spec.params_total,
            "vocab, tie, layers": (d.vocab_size, d.tie_word_embeddings, d.num_layers) == (
                spec.vocab_size, spec.tie_word_embeddings, spec.num_layers),
            "KV B/token": d.kv_bytes_per_token_uncapped() == kv_cache_bytes_per_token(spec),
            "logit softcap": bool(d.final_logit_softcapping) == bool(arch.get("logit_softcap")),
        }
        kinds = sorted({layer.attention + (f"({layer.sliding_window})" if layer.sliding_window else "")
                        for layer in d.layers})
        bad = [k for k, ok in checks.items() if not ok]
        rows.append([key, d.params_total, "all agree" if not bad else "DISAGREE: " + ", ".join(bad),
                     ", ".join(kinds), f"{d.build_seconds:.2f} + {d.cache_seconds:.2f}"])
    print(table(["catalog model", "params (meta)", "linear shapes, biases, norms, count, vocab, KV, softcap",
                 "attention kinds", "build + cache probe s"], rows))
    print()
    print("### Time to describe a model in a fresh process (what a CLI call pays)\n")
    rows = []
    probe = ("import time, json, sys; t0 = time.perf_counter(); import torch, transformers; t1 = time.perf_counter();"
             "from advisor.core.architecture import describe_architecture; cfg = json.loads(sys.argv[1]);"
             "d = describe_architecture(cfg); t2 = time.perf_counter(); w = describe_architecture(cfg);"
             "t3 = time.perf_counter();"
             "print(json.dumps([t1 - t0, t2 - t1, d.build_seconds, t3 - t2, w.build_seconds, w.cache_seconds,"
             " d.params_total]))")
    for label, fields in (("Qwen2.5-7B", resolve_model("qwen7b").config),
                          ("Qwen3-30B-A3B", REAL["Qwen/Qwen3-30B-A3B"][0]),
                          ("Qwen3-235B-A22B", REAL["Qwen/Qwen3-235B-A22B"][0])):
        out = subprocess.run([sys.executable, "-c", probe, json.dumps(fields)], capture_output=True, text=True,
                             cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
        imp, first, first_build, second, build, cache, params = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append([label, params, f"{imp:.2f}", f"{first:.2f}", f"{first_build:.2f}", f"{second:.2f}",
                     f"{build:.3f}", f"{cache:.3f}"])
    print(table(["config", "params", "import torch + transformers s", "first describe s",
                 "of which meta build (transformers' lazy imports) s", "second describe s", "meta build s",
                 "cache probe s"], rows))
    print()


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


SECTIONS = {"layout": section_layout, "quant": section_quant, "peft": section_peft, "memory": section_memory,
            "describe": section_describe}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=list(SECTIONS), action="append",
                        help="run only these sections (repeatable; default: all)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    args = parser.parse_args(argv)
    _quiet()
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    models = list(QUICK) if args.quick else list(TINY)
    print(f"# MoE findings on the CPU (torch {_version('torch')}, transformers {_version('transformers')}, "
          f"peft {_version('peft')}, bitsandbytes {_version('bitsandbytes')})\n")
    for name in args.section or list(SECTIONS):
        start = time.perf_counter()
        fn = SECTIONS[name]
        fn() if name == "describe" else fn(models)
        print(f"_(section {name}: {time.perf_counter() - start:.0f} s)_\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
