"""Eval fidelity: how far a plan's base model drifts from the bf16 base, and eval loss.

fidelity = mean over eval tokens t of KL(P_ref(.|x<=t) || P_plan(.|x<=t)) in nats, where P_ref
is the next-token distribution of the base model loaded in bfloat16 and P_plan that of the
plan's base as the probe built it (quantized, in the plan's precision), before any training
(LoRA's B matrices start at zero, so the adapted model is the base). This is the KL measure
of quantization error used by llama.cpp's ``perplexity --kl-divergence``. The eval text is cut
into independent windows of ``window`` tokens; every position of a window counts.
"""

from __future__ import annotations

import contextlib
from typing import Any

from advisor.runtime.cuda_boundary import cuda, tensor_device

REFERENCE_DTYPE = "bfloat16"


def _windows(ids: Any, window: int) -> list[Any]:
    return [w for w in ids.split(window, dim=1) if w.shape[1] >= 2]


def _autocast(device: str, plan: Any):
    import torch

    if plan.precision.startswith("mixed"):
        dtype = torch.bfloat16 if plan.precision == "mixed_bf16" else torch.float16
        return torch.autocast(device_type=tensor_device(device), dtype=dtype)
    return contextlib.nullcontext()


@contextlib.contextmanager
def no_cpu_weight_packing(model: Any):
    """Keep bitsandbytes 4-bit layers trainable through an evaluation on the CPU.

    bitsandbytes 0.50 (nn/modules.py ``Linear4bit.forward``): on a CPU with AVX512-BF16, a forward in eval
    mode on an input without grad repacks the weight for inference for good (``packing_format_for_cpu``);
    ``matmul_4bit`` then takes ``gemv_4bit``, which has no backward, so a later training step loses the
    gradient through every 4-bit base layer (measured: a QLoRA probe's loss rose over 60 steps after the
    fidelity pass, fell without it). The flag that allows the repacking is turned off for the block."""
    layers = [m for m in model.modules() if getattr(m, "support_avx512bf16_for_cpu", False)]
    for m in layers:
        m.support_avx512bf16_for_cpu = False
    try:
        yield
    finally:
        for m in layers:
            m.support_avx512bf16_for_cpu = True


def reference_logprobs(weights_dir: str, ids: Any, window: int, device: str) -> list[Any]:
    """Log-probabilities (fp32, kept on the CPU) of the bf16 base over each window of ``ids``."""
    import torch
    from transformers import AutoModelForCausalLM

    on = tensor_device(device)
    model = AutoModelForCausalLM.from_pretrained(weights_dir, dtype=getattr(torch, REFERENCE_DTYPE),
                                                 local_files_only=True).to(on)
    model.eval()
    out = []
    with torch.no_grad():
        for w in _windows(ids, window):
            logits = model(input_ids=w.to(on)).logits
            out.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    del model
    if device == "cuda":
        cuda().empty_cache()
    return out


def evaluate(model: Any, ids: Any, window: int, device: str, plan: Any,
             ref: list[Any] | None = None) -> dict[str, float]:
    """Eval loss (next-token cross-entropy) of ``model`` over ``ids``; and the mean KL from ``ref`` when given."""
    import torch
    import torch.nn.functional as F

    on = tensor_device(device)
    was_training = model.training
    model.eval()
    kl_sum, ce_sum, n_kl, n_ce = 0.0, 0.0, 0, 0
    try:
        with torch.no_grad(), _autocast(device, plan), no_cpu_weight_packing(model):
            for i, w in enumerate(_windows(ids, window)):
                logits = model(input_ids=w.to(on)).logits.float()
                logp = torch.log_softmax(logits, dim=-1)
                ce = F.nll_loss(logp[0, :-1], w[0, 1:].to(on), reduction="sum")
                ce_sum += float(ce)
                n_ce += w.shape[1] - 1
                if ref is not None:
                    r = ref[i].to(on)
                    kl = (r.exp() * (r - logp)).sum(-1)
                    kl_sum += float(kl.sum())
                    n_kl += kl.numel()
    finally:
        model.train(was_training)
    out = {"eval_loss": ce_sum / max(n_ce, 1), "tokens": n_ce + len(_windows(ids, window))}
    if ref is not None:
        out["kl"] = kl_sum / max(n_kl, 1)
    return out
