"""GPU checks of the stand-ins for GPU-only kernels (skipped without a CUDA GPU and the library):

- Liger's fused linear cross-entropy (Triton): the stand-in's peak equals the real kernel's
  ``max_memory_allocated`` over one loss forward + backward, and the loss agrees;
- flash-attention 2: the simulation runs sdpa in its place (same saved tensors: q, k, v, output,
  logsumexp); one training step of a small model with flash_attention_2 peaks where the sdpa step does.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def _peak(fn) -> tuple[int, float]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, float(loss)


@pytest.mark.gpu
@gpu
@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")
@pytest.mark.parametrize("tokens,hidden,vocab,head_trains", [(4096, 3584, 152064, False), (2048, 2048, 151936, True)])
def test_fused_linear_standin_peak_equals_ligers(tokens, hidden, vocab, head_trains):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    from advisor.runtime.simulate.fused_loss import fused_linear_cross_entropy

    g = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(vocab, hidden, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02)
    weight.requires_grad_(head_trains)
    target = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)

    def run(f):
        def step():
            x = torch.randn(tokens, hidden, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_(True)
            loss = f(x, weight, target)
            loss.backward()
            return loss.detach()
        return step

    real_peak, real_loss = _peak(run(lambda x, w, y: liger_fused_linear_cross_entropy(x, w, y)))
    weight.grad = None
    standin_peak, standin_loss = _peak(run(fused_linear_cross_entropy))
    assert abs(standin_peak - real_peak) <= 0.02 * real_peak, (standin_peak, real_peak)
    assert abs(standin_loss - real_loss) < 0.05 * abs(real_loss)


@pytest.mark.gpu
@gpu
@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn")
def test_flash_attention_step_peaks_where_the_sdpa_standin_does():
    from advisor.runtime.build import build_training_setup

    spec = resolve_model("qwen2.5-0.5b")
    peaks = {}
    for attn in ("flash_attention_2", "sdpa"):
        plan = Plan(method="lora", seq_len=2048, attn_impl=attn, gradient_checkpointing=False)
        setup = build_training_setup(spec, plan, device="cuda", num_layers=4)
        assert not any("run as sdpa" in n for n in setup.notes)  # the real flash kernel on CUDA
        batch = [setup.make_batch(0)]
        setup.train_step(batch)  # warm-up: optimizer states
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        setup.train_step(batch)
        torch.cuda.synchronize()
        peaks[attn] = torch.cuda.max_memory_allocated() - base
        del setup
        torch.cuda.empty_cache()
    assert abs(peaks["flash_attention_2"] - peaks["sdpa"]) <= 0.02 * peaks["sdpa"], peaks
