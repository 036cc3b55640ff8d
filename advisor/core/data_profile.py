"""The lengths of a user's training documents, and what they mean for a plan's batches.

Without packing a batch is padded to its longest document (cut at seq_len), so the memory peak is
set by the longest batch and a step carries padding; with packing every row is seq_len tokens of
real documents. Built by advisor.runtime.probe.data_profile (tokenizer or a lengths file).

Samples that carry images (a vision-language data file) are planned on the largest: the image sizes of the sample
whose images take the most tokens (the model's own processor counts them: advisor.core.vision_tokens), at the
sequence length of the longest sample's text and image tokens together.
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
    images: tuple[tuple[str, ...], ...] = ()
    """Each document's image sizes (``WxH``), where the file's samples carry images; () when none does."""

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

    def sized(self, plan, spec=None):
        """``plan`` with the sequence length its memory peak is set by (the longest batch unless packed); with
        images and a vision-language ``spec``, also the images of the sample they cost the most tokens
        (``largest_sample``), and the text beside them (``seq_len``) that makes the language model's sequence the
        longest sample's text and image tokens."""
        if not self.images or spec is None or not spec.is_vision_language:
            return self.packed(plan).with_(seq_len=self.memory_seq_len(plan.seq_len, plan.packing))
        largest, beside, lengths = self.largest_sample(spec, plan)
        # seq_len is the text beside the images (docs/vision.md): the language model's sequence is the longest
        # sample's text and image tokens together, not cut at seq_len (a sample's image tokens are never cut)
        return plan.with_(image_sizes=largest, seq_len=max(plan.seq_len if plan.packing else 1, max(lengths) - beside))

    def packed(self, plan):
        """``plan`` with these documents' length when it packs them: their token-weighted mean, the one length
        whose rows cost the attention these documents do (advisor.core.packed_docs.token_weighted_length)."""
        if not getattr(plan, "packing", False):
            return plan
        self.refuse_doc_len_flag(plan.doc_len)
        from advisor.core.packed_docs import token_weighted_length

        return plan.with_(doc_len=token_weighted_length(self.lengths, plan.seq_len))

    def refuse_doc_len_flag(self, doc_len) -> None:
        """Packed documents' length comes from the data or from --doc-len, not both (a one-line error naming it)."""
        if doc_len is not None:
            from advisor.core.errors import AdvisorInputError

            raise AdvisorInputError("--doc-len", f"the --data documents give their own lengths ({self.source}): "
                                    "leave --doc-len out", doc_len)

    def refuse_image_flag(self, image_sizes) -> None:
        """Images come from the samples or from --image-size, not both (a one-line error naming the flag)."""
        if self.images and image_sizes:
            from advisor.core.errors import AdvisorInputError

            raise AdvisorInputError("--image-size", f"the --data samples carry their own images ({self.source}): "
                                    "leave --image-size out", ",".join(image_sizes))

    def largest_sample(self, spec, plan) -> tuple[tuple[str, ...], int, list[int]]:
        """(the image sizes of the sample whose images take the most tokens at ``plan``'s pixel bounds, the tokens
        those images take in the language model's sequence, every sample's text and in-sequence image tokens)."""
        from advisor.core.vision_tokens import count_sample

        counted: dict[tuple[str, ...], tuple[int, int]] = {}
        for sizes in set(self.images):
            vis = count_sample(spec, plan.with_(image_sizes=sizes)) if sizes else None
            counted[sizes] = (vis.tokens, vis.text_tokens) if vis is not None else (0, 0)
        largest = max(counted, key=lambda sizes: (counted[sizes][0], sizes))
        return largest, counted[largest][1], [n + counted[sizes][1] for n, sizes in zip(self.lengths, self.images)]

    def to_dict(self) -> dict:
        out = {"source": self.source, "how": self.how, "documents": len(self.lengths),
               "total_tokens": sum(self.lengths), "longest_tokens": max(self.lengths),
               "mean_tokens": sum(self.lengths) / len(self.lengths)}
        if self.images:
            out["samples_with_images"] = sum(1 for sizes in self.images if sizes)
            out["images"] = sum(len(sizes) for sizes in self.images)
        return out
