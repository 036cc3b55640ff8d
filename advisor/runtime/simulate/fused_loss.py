"""Fused linear + cross-entropy: the loss computed from the last hidden states and the output
projection in chunks of tokens, never holding all logits (Liger-Kernel's
``LigerFusedLinearCrossEntropyFunction``, which transformers applies for ``use_liger_kernel``,
axolotl for ``liger_fused_linear_cross_entropy`` and LLaMA-Factory for ``enable_liger_kernel``).

Liger's kernels are Triton: they need a GPU. ``FusedLinearCrossEntropyStandin`` runs the same
algorithm with torch ops, keeping what sets its memory (liger_kernel/ops/fused_linear_cross_entropy.py,
liger-kernel 0.8.5):

- the chunk rule: ``inc_factor = cdiv(V, H)``; ``chunk = min(next_power_of_2(cdiv(BT, inc_factor)), BT)``
  tokens, so one chunk's logits (chunk x V) are about BT x H elements;
- the gradients are computed in the forward: ``grad_input`` (BT x H, the input's dtype) and, when the
  output projection trains, ``grad_weight`` (V x H, the weight's dtype) are allocated before the chunk
  loop, filled chunk by chunk, and are the only tensors saved for backward (``ctx.save_for_backward``);
- on CUDA (``_can_use_mm_out``: grad mode is off inside ``Function.forward``) one ``chunk x V`` logits
  buffer is reused with ``torch.mm(out=)``; the Triton cross-entropy kernel overwrites the logits with
  their gradient in place (no fp32 copy of the chunk), and ``grad_input`` rows are written with
  ``torch.mm(out=)``; ``grad_weight`` accumulates with ``addmm(out=)``;
- a float32 ``loss_1d`` of BT values and the ``target != ignore_index`` mask.

The in-place softmax below computes in the logits' dtype where the Triton kernel computes each row
in fp32 registers: the loss value is close (bf16 rounding), the memory is the kernel's.
"""

from __future__ import annotations

from advisor.memory.loss_dora_packing import liger_chunk_tokens
from advisor.runtime.tensors import IGNORE_INDEX


def _function():
    import torch

    class FusedLinearCrossEntropyStandin(torch.autograd.Function):
        """Liger's LigerFusedLinearCrossEntropyFunction (reduction mean, no bias / softcap / z-loss), in torch."""

        @staticmethod
        def forward(ctx, _input, weight, target, ignore_index=IGNORE_INDEX):
            BT, H = _input.shape
            V = weight.shape[0]
            chunk = liger_chunk_tokens(BT, H, V)
            grad_input = torch.zeros_like(_input)
            grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
            loss_1d = torch.zeros(BT, dtype=torch.float32, device=_input.device)
            target_mask = target != ignore_index
            n_non_ignore = target_mask.sum().clamp(min=1)  # liger reads it with .item(); a tensor keeps it fake-safe
            logits = torch.empty((chunk, V), dtype=_input.dtype, device=_input.device)  # the reused mm(out=) buffer
            for start in _chunk_starts(_input, BT, chunk):
                end = min(start + chunk, BT)
                x = _input[start:end]
                y = target[start:end]
                z = logits[: end - start]
                torch.mm(x, weight.t(), out=z)
                valid = (y != ignore_index)
                safe_y = y.clamp(min=0).unsqueeze(1)
                # the Triton kernel's row pass, in place: loss = logsumexp - z_y; z <- (softmax - onehot) / n
                z_max = z.amax(dim=1, keepdim=True)
                z_y = z.gather(1, safe_y).float()
                z.sub_(z_max).exp_()
                total = z.sum(dim=1, keepdim=True, dtype=torch.float32)
                lse = total.log() + z_max.float()
                row_loss = (lse - z_y).squeeze(1)
                row_loss.mul_(valid).div_(n_non_ignore)
                loss_1d[start:end] = row_loss
                z.div_(total.to(z.dtype))
                z.scatter_add_(1, safe_y, torch.full_like(safe_y, -1, dtype=z.dtype))
                z.mul_((valid.to(z.dtype) / n_non_ignore.to(z.dtype)).unsqueeze(1))
                torch.mm(z, weight, out=grad_input[start:end])
                if grad_weight is not None:
                    grad_weight.addmm_(z.t(), x)
            del logits
            ctx.save_for_backward(grad_input.detach(), grad_weight.detach() if grad_weight is not None else None)
            return loss_1d.sum()

        @staticmethod
        def backward(ctx, grad_output):
            grad_input, grad_weight = ctx.saved_tensors
            # liger fused_linear_cross_entropy_backward: scale in place unless grad_output is 1
            grad_input.mul_(grad_output)
            if grad_weight is not None:
                grad_weight.mul_(grad_output)
            return grad_input, grad_weight, None, None

    return FusedLinearCrossEntropyStandin


def _chunk_starts(_input, tokens: int, chunk: int) -> list[int]:
    """Where each chunk of the loop starts. Under fake tensors (the simulation) only the first two chunks and the
    last are run: the second leaves the first's temporaries to be freed as it rebinds them, and every later full
    chunk repeats the second allocation for allocation (the same shapes into the same reused buffers), so the
    peak and the allocator's events are those of the whole loop (tests/test_fused_loss.py holds the two equal).
    Real tensors run every chunk: the loss and the gradients are the values."""
    from torch._subclasses.fake_tensor import FakeTensor

    starts = list(range(0, tokens, chunk))
    if isinstance(_input, FakeTensor) and len(starts) > 3:
        return starts[:2] + starts[-1:]
    return starts


_FUNCTION = None


def fused_linear_cross_entropy(hidden_2d, weight, target):
    """The mean next-token loss of ``hidden_2d @ weight.T`` against ``target`` (already shifted), Liger's way."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _function()
    return _FUNCTION.apply(hidden_2d, weight, target)


def fused_linear_causal_lm_loss(model, input_ids, labels, *, impl: str = "standin", position_ids=None):
    """The causal-LM loss as liger's ``lce_forward`` computes it: the decoder's last hidden state, labels
    padded and shifted (LigerForCausalLMLoss), then the fused projection + cross-entropy; no logits.

    ``impl``: "standin" (this module, any device) or "liger" (liger_kernel's Triton function, CUDA only).
    """
    import torch.nn.functional as F

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"position_ids": position_ids} if position_ids is not None else {}
    hidden = base.model(input_ids=input_ids, **kwargs).last_hidden_state
    head = base.get_output_embeddings()
    shift = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    h = hidden.view(-1, hidden.shape[-1])
    y = shift.view(-1)
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return liger_fused_linear_cross_entropy(h, head.weight, y, ignore_index=IGNORE_INDEX)
    return fused_linear_cross_entropy(h, head.weight, y)
