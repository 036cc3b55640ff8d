"""The data a run will see: token lengths (longest sequence) and total tokens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHARS_PER_TOKEN = 4.0  # rough English average for BPE vocabularies (OpenAI tokenizer guide); used without a tokenizer


@dataclass(frozen=True)
class DataStats:
    documents: int
    total_tokens: int
    longest_tokens: int
    measured: bool
    """True when a real tokenizer counted the tokens; False for the characters/4 approximation."""


def data_stats(path: str, tokenizer_dir: str | None) -> DataStats:
    from advisor.runtime.probe import read_documents  # the same reader the probe trains on

    texts = read_documents(path)
    tok = _tokenizer(tokenizer_dir)
    if tok is not None:
        lengths = [len(ids) for ids in tok(texts, add_special_tokens=True)["input_ids"]] if texts else [0]
        return DataStats(len(texts), sum(lengths), max(lengths), True)
    lengths = [int(len(t) / CHARS_PER_TOKEN) + 1 for t in texts] or [0]
    return DataStats(len(texts), sum(lengths), max(lengths), False)


def _tokenizer(folder: str | None):
    if not folder:
        return None
    p = Path(folder)
    if not any((p / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception:  # noqa: BLE001 - a broken tokenizer falls back to the approximation
        return None
