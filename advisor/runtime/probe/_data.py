"""Training data for a probe: synthetic token ids, or a user's text packed to the sequence length.

- synthetic (default): uniform random ids below the vocabulary size, seeded. Memory and speed
  do not depend on the values.
- a ``.jsonl`` file (one JSON object per line with a string field ``"text"``) or any other file
  read as UTF-8 text (one document). Tokenized with the model directory's tokenizer when it has
  one; otherwise with the byte-level fallback: each UTF-8 byte is one token id (0-255) and
  documents end with id 0 (NUL, which text never contains). The fallback needs a vocabulary of
  at least 256 ids. Documents are concatenated into one stream and cut into sequences of
  ``seq_len``; when the run needs more sequences than the file holds, the stream is reused from
  the start (the probe measures memory and speed, not generalization).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from advisor.core.errors import AdvisorInputError

BYTE_EOS = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def probes_dir() -> Path:
    """The probe texts shipped in the package (advisor/data/probes/: eval and training texts)."""
    return Path(__file__).resolve().parents[2] / "data" / "probes"


def default_eval_texts() -> list[Path]:
    """The shipped eval texts (advisor/data/probes/eval/*.txt)."""
    return sorted((probes_dir() / "eval").glob("*.txt"))


def default_train_texts() -> list[Path]:
    """The shipped training texts (advisor/data/probes/train/*.txt), used to train the tiny test models."""
    return sorted((probes_dir() / "train").glob("*.txt"))


def read_documents(path: str | Path, flag: str = "--data") -> list[str]:
    """Documents of a JSONL file (field "text", or a "messages" list: its contents joined) or of a plain text file
    (one document)."""
    return [text for text, _ in read_samples(path, flag)]


def read_samples(path: str | Path, flag: str = "--data") -> list[tuple[str, tuple[str, ...]]]:
    """(text, image sizes ``WxH``) of each sample of a JSONL file, or the one document of a text file. A sample's
    ``images`` (a vision-language sample, as TRL's and LLaMA-Factory's datasets carry them) are paths relative to the
    file (their size read from the image header, PIL), ``{"width": W, "height": H}``, or ``{"path": ...}``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise AdvisorInputError(flag, "no such file", str(path))
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise AdvisorInputError(flag, f"{p} is not UTF-8 text (byte {e.start})", str(path), show_value=False) from None
    except OSError as e:
        raise AdvisorInputError(flag, f"cannot read {p} ({e.strerror})", str(path), show_value=False) from None
    if p.suffix.lower() != ".jsonl":
        docs = [(text, ())] if text.strip() else []
    else:
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise AdvisorInputError(flag, f"{p} line {n} is not JSON ({e.msg})", str(path),
                                        show_value=False) from None
            body = _sample_text(obj)
            if body is None:
                raise AdvisorInputError(flag, f'{p} line {n} needs a string field "text" (or a "messages" list)',
                                        str(path), show_value=False)
            images = tuple(_image_size(p, n, image, flag) for image in (obj.get("images") or []))
            if body.strip() or images:
                docs.append((body, images))
    if not docs:
        raise AdvisorInputError(flag, f"{p} holds no text", str(path), show_value=False)
    return docs


def _sample_text(obj: Any) -> str | None:
    """A sample's text: its "text", or its messages' text contents joined (None: neither)."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("text"), str):
        return obj["text"]
    messages = obj.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    parts = []
    for m in messages:
        content = m.get("content")
        items = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        parts += [c if isinstance(c, str) else c.get("text", "") for c in items if isinstance(c, (str, dict))]
    return "\n".join(x for x in parts if isinstance(x, str))


def _image_size(data: Path, line: int, image: Any, flag: str) -> str:
    """One image of a sample as ``WxH``: given, or read from the file's header (PIL opens it lazily)."""
    if isinstance(image, dict) and isinstance(image.get("width"), int) and isinstance(image.get("height"), int):
        if image["width"] < 1 or image["height"] < 1:
            raise AdvisorInputError(flag, f"{data} line {line}: an image needs a width and height of at least 1",
                                    image, show_value=False)
        return f"{image['width']}x{image['height']}"
    where = image.get("path") if isinstance(image, dict) else image
    if not isinstance(where, str):
        raise AdvisorInputError(flag, f'{data} line {line}: an image is a path or {{"width": W, "height": H}}',
                                image, show_value=False)
    file = Path(where).expanduser()
    file = file if file.is_absolute() else data.parent / file
    try:
        from PIL import Image

        with Image.open(file) as im:
            width, height = im.size
    except (OSError, ValueError) as e:
        raise AdvisorInputError(flag, f"{data} line {line}: cannot read the image {file} ({e})", where,
                                show_value=False) from None
    return f"{width}x{height}"


@dataclass(frozen=True)
class Tokenizer:
    """Text to ids: the model's own tokenizer, or the byte-level fallback."""

    kind: str
    """model or bytes."""
    encode: Callable[[str], list[int]]
    """Text to token ids (no special tokens)."""
    eos_id: int
    """Id appended after each document."""


def load_tokenizer(model_dir: str | None, vocab_size: int) -> Tokenizer:
    """The tokenizer of ``model_dir`` when it ships one, else the byte-level fallback."""
    if model_dir and any((Path(model_dir) / f).is_file() for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        eos = tok.eos_token_id if tok.eos_token_id is not None else (tok.pad_token_id or 0)
        return Tokenizer("model", lambda s: tok(s, add_special_tokens=False)["input_ids"], int(eos))
    if vocab_size < 256:
        raise AdvisorInputError("--data", f"the byte-level fallback tokenizer needs a vocabulary of 256 ids, "
                                f"the model has {vocab_size} and no tokenizer", vocab_size, show_value=False)
    return Tokenizer("bytes", lambda s: list(s.encode("utf-8")), BYTE_EOS)


def token_stream(docs: list[str], tok: Tokenizer) -> list[int]:
    out: list[int] = []
    for d in docs:
        out.extend(tok.encode(d))
        out.append(tok.eos_id)
    return out


def pack(stream: list[int], seq_len: int, n_sequences: int, *, flag: str = "--data") -> Any:
    """``n_sequences`` rows of ``seq_len`` consecutive ids from the stream (reused from the start if short)."""
    import torch

    if len(stream) < seq_len:
        raise AdvisorInputError(flag, f"holds {len(stream):,} tokens, fewer than one sequence of {seq_len:,}",
                                len(stream), show_value=False)
    usable = len(stream) // seq_len
    ids = torch.tensor(stream[: usable * seq_len], dtype=torch.long).view(usable, seq_len)
    rows = torch.arange(n_sequences) % usable
    return ids[rows]


def synthetic(vocab_size: int, n_sequences: int, seq_len: int, seed: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n_sequences, seq_len), generator=g, dtype=torch.long)


def training_batches(*, data: str | None, model_dir: str | None, vocab_size: int, micro_batch: int, seq_len: int,
                     grad_accum: int, steps: int, seed: int) -> tuple[list[list[Any]], str]:
    """For each optimizer step, its micro-batches of input ids [micro_batch, seq_len]; and the tokenizer kind."""
    n = steps * grad_accum * micro_batch
    if data is None:
        ids, kind = synthetic(vocab_size, n, seq_len, seed), "none"
    else:
        tok = load_tokenizer(model_dir, vocab_size)
        ids, kind = pack(token_stream(read_documents(data), tok), seq_len, n), tok.kind
        if int(ids.max()) >= vocab_size:
            raise AdvisorInputError("--data", f"the tokenizer produced id {int(ids.max())}, beyond the model's "
                                    f"vocabulary of {vocab_size}", data, show_value=False)
    micro = list(ids.split(micro_batch))
    return [micro[s * grad_accum:(s + 1) * grad_accum] for s in range(steps)], kind


def eval_ids(paths: list[str], model_dir: str | None, vocab_size: int, max_tokens: int) -> Any:
    """The eval texts as one row of at most ``max_tokens`` ids [1, n]."""
    import torch

    tok = load_tokenizer(model_dir, vocab_size)
    docs = [d for p in paths for d in read_documents(p, flag="eval texts")]
    stream = token_stream(docs, tok)[:max_tokens]
    return torch.tensor(stream, dtype=torch.long).unsqueeze(0)


def data_profile(path: str | Path, model_dir: str | None, *, flag: str = "--data"):
    """Token lengths of a data file: a lengths file (one whole number per line: "given"), or JSONL / text
    tokenized with the model directory's tokenizer ("measured"), else characters / 4 ("estimated",
    advisor.diagnosis.preflight's rule for a model without a local tokenizer); and each sample's image sizes where
    the samples carry images (their text lengths are the text's: the image tokens are the model's, counted by
    ``DataProfile.sized``)."""
    from advisor.core.data_profile import DataProfile

    p = Path(path).expanduser()
    if p.is_file():
        try:
            lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except (UnicodeDecodeError, OSError):
            lines = []
        if lines and all(ln.isdigit() for ln in lines):
            lengths = tuple(int(ln) for ln in lines)
            if min(lengths) < 1:
                raise AdvisorInputError(flag, f"{p}: token lengths must be at least 1", str(path), show_value=False)
            return DataProfile(lengths, str(p), "given")
    samples = read_samples(path, flag)
    docs = [text for text, _ in samples]
    images = tuple(sizes for _, sizes in samples) if any(sizes for _, sizes in samples) else ()
    if model_dir and any((Path(model_dir) / f).is_file() for f in TOKENIZER_FILES):
        tok = load_tokenizer(model_dir, 1 << 20)
        return DataProfile(tuple(len(tok.encode(d)) + 1 for d in docs), str(p), "measured", images)
    return DataProfile(tuple(int(len(d) / 4) + 1 + 1 for d in docs), str(p), "estimated", images)
