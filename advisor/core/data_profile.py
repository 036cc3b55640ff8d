"""The lengths of a user's training documents, and what they mean for a plan's batches.

Without packing a batch is padded to its longest document (cut at seq_len), so the memory peak is
set by the longest batch and a step carries padding; with packing every row is seq_len tokens of
real documents. Built by advisor.runtime.probe.data_profile (tokenizer or a lengths file).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb


@dataclass(frozen=True)
class DataProfile:
    """Token lengths of the documents of a data file."""

    lengths: tuple[int, ...]
    """Tokens per document (end-of-document token included)."""
    source: str
    """The file they were read from."""
    how: str
    """measured (the model's tokenizer), given (a lengths file) or estimated (characters / 4)."""

    def longest(self, seq_len: int) -> int:
        """The longest batch's padded length: the longest document, cut at seq_len (truncation)."""
        return max(1, min(max(self.lengths), seq_len))

    def mean_tokens(self, seq_len: int) -> float:
        """Mean real tokens per sequence after truncation at seq_len."""
        return sum(min(n, seq_len) for n in self.lengths) / len(self.lengths)

    def expected_padded(self, seq_len: int, micro_batch: int) -> float:
        """E[max length of micro_batch documents drawn without replacement], cut at seq_len: the padded
        length of an average batch (order statistics: P(max = k-th smallest) = (C(k, b) - C(k-1, b)) / C(n, b))."""
        xs = sorted(min(n, seq_len) for n in self.lengths)
        n, b = len(xs), min(micro_batch, len(xs))
        total = comb(n, b)
        return sum(x * (comb(k, b) - comb(k - 1, b)) for k, x in enumerate(xs, 1)) / total

    def memory_seq_len(self, seq_len: int, packing: bool) -> int:
        """The sequence length that sets the memory peak: seq_len when packed, else the longest batch's."""
        return seq_len if packing else self.longest(seq_len)

    def real_token_fraction(self, seq_len: int, micro_batch: int, packing: bool) -> float:
        """Real tokens / tokens computed on: 1 when packed, else mean length / mean padded length."""
        if packing:
            return 1.0
        return self.mean_tokens(seq_len) / self.expected_padded(seq_len, micro_batch)

    def sized(self, plan):
        """``plan`` with the sequence length its memory peak is set by (the longest batch unless packed)."""
        return plan.with_(seq_len=self.memory_seq_len(plan.seq_len, plan.packing))

    def to_dict(self) -> dict:
        return {"source": self.source, "how": self.how, "documents": len(self.lengths),
                "total_tokens": sum(self.lengths), "longest_tokens": max(self.lengths),
                "mean_tokens": sum(self.lengths) / len(self.lengths)}
