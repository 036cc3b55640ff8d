"""Step-time term of the chunked loss (the other loss, DoRA, attention and packing terms live in
advisor/speed/terms.py and advisor/speed/throughput.py).

The chunked loss (advisor.runtime.build.chunked_causal_lm_loss) wraps each chunk's output projection
and cross-entropy in torch.utils.checkpoint: backward runs the head's GEMM once more per chunk.
"""

from __future__ import annotations

from advisor.speed.inputs import StepInputs
from advisor.speed.kernels import gemm_seconds
from advisor.speed.terms import term


@term("chunked_loss_recompute", label="chunked loss: head forward again")
def chunked_loss_recompute(s: StepInputs) -> float:
    """The lm_head GEMM (tokens x hidden x vocab) run again in backward, chunk by chunk (Chen et al. 2016 §3
    applied to the loss; torch.utils.checkpoint per chunk)."""
    if s.plan.loss != "chunked":
        return 0.0
    return gemm_seconds(s, s.tokens, s.model.vocab_size, s.model.hidden_size)
