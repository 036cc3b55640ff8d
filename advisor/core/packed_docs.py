"""The documents of one packed sequence: how many, how long, and what attention then does.

With packing, documents are concatenated into rows of ``seq_len`` tokens and ``position_ids`` restart at each
one (TRL's padding-free ``packing_strategy="bfd"``, transformers' ``DataCollatorWithFlattening``). A row is
``seq_len // doc_len`` documents of ``doc_len`` tokens and, where they do not fill it, one shorter document at
its end. ``doc_len`` None (not stated): two documents per row, enough for transformers to see a packed row
(``masking_utils.find_packed_sequence_indices``), whose memory does not depend on where they meet.

What each attention implementation then does (transformers 5.25 ``masking_utils.create_causal_mask``):

- ``flash_attention_2/3``: the mask interface returns None (``flash_attention_mask``); the kernel runs varlen on
  ``cu_seqlens`` taken from ``position_ids`` (``modeling_flash_attention_utils.prepare_fa_kwargs_from_position_ids``):
  each document attends to itself only, sum(doc_len^2) work, no mask.
- ``sdpa``: a packed row turns the causal skip off (``allow_is_causal_skip = False``) and ``sdpa_mask`` builds a
  bool ``[batch, 1, seq, seq]`` block-diagonal causal mask; the kernel computes every block of it.
- ``eager``: ``eager_mask`` builds the same mask as an additive float mask (with or without packing).
"""

from __future__ import annotations

from advisor.core.plan import FLASH_ATTENTION as FLASH  # the implementations that run varlen on cu_seqlens


def row_documents(seq_len: int, doc_len: int | None) -> tuple[int, ...]:
    """The documents' lengths in one packed row of ``seq_len`` tokens (``doc_len`` None: two halves)."""
    if doc_len is None:
        half = seq_len // 2
        return (half, seq_len - half) if half else (seq_len,)
    full, rest = divmod(seq_len, min(doc_len, seq_len))
    return (min(doc_len, seq_len),) * full + ((rest,) if rest else ())


def documents_per_row(plan) -> int:
    """Documents in one packed row of ``plan`` (1: not packed)."""
    if not getattr(plan, "packing", False):
        return 1
    return len(row_documents(plan.seq_len, plan.doc_len))


def builds_packed_mask(plan) -> bool:
    """Whether transformers builds the block-diagonal mask of packed documents: sdpa or eager over rows of two or
    more documents (a row of one document is an ordinary causal row: find_packed_sequence_indices returns None)."""
    return documents_per_row(plan) > 1 and plan.attn_impl not in FLASH


def packed_attention_scale(lengths, seq_len: int) -> float:
    """Attention work of packed documents against one ``seq_len``-long causal sequence of as many tokens:
    sum(s_i^2) / (sum(s_i) x seq_len) (FlashAttention-2 varlen: each document's own causal block, Dao 2023 §3.1)."""
    docs = [min(n, seq_len) for n in lengths if n > 0]
    total = sum(docs)
    return sum(n * n for n in docs) / (total * seq_len) if total else 1.0


def varlen_attention_scale(plan) -> float:
    """The varlen kernel's attention work of one of ``plan``'s packed rows against an unpacked row (1: unknown
    lengths or not flash: sdpa and eager compute the whole masked seq^2, advisor.speed.kernels.attended_keys)."""
    if not plan.packing or plan.doc_len is None or plan.attn_impl not in FLASH:
        return 1.0
    return packed_attention_scale(row_documents(plan.seq_len, plan.doc_len), plan.seq_len)


def token_weighted_length(lengths, seq_len: int) -> int:
    """The document length a token sees on average, sum(s_i^2) / sum(s_i) (each cut at seq_len): the ``doc_len``
    whose uniform rows cost the same attention as these documents (packed_attention_scale = doc_len / seq_len)."""
    docs = [min(n, seq_len) for n in lengths if n > 0]
    return max(1, round(sum(n * n for n in docs) / sum(docs))) if docs else seq_len
