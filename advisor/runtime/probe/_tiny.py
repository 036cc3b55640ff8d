"""A tiny byte-level language model trained for a few seconds on the shipped texts.

Random weights have nothing for quantization to damage in a meaningful way; a model that has
learned something (here: English byte statistics of advisor/data/probes/train/*.txt) does, so eval fidelity
and eval loss mean something on it. It is written as a local model directory (config.json and
safetensors weights, no tokenizer: the probe's byte-level fallback tokenizes for it, one byte one
id, vocabulary 256) that ``advisor probe --model DIR --weights DIR`` and the tests can use.
Training is seeded, on one thread, with a fixed step count (the same machine gives the same weights); the result is
cached in the temp directory under a key of the texts and settings, so a test session trains it once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

TINY_CONFIG = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 10000.0,
    "bos_token_id": 0, "eos_token_id": 0,
}
TRAIN = {"steps": 150, "seq_len": 128, "batch": 8, "lr": 3e-3, "seed": 0}


def _key(texts: list[Path], config: dict, train: dict) -> str:
    h = hashlib.sha256(json.dumps([config, train], sort_keys=True).encode())
    for p in texts:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def train_tiny_model(out_dir: str | Path, *, config: dict | None = None, train: dict | None = None) -> Path:
    """Train the tiny model on advisor/data/probes/train/*.txt and save it to ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.core.catalog import build_hf_config
    from advisor.runtime.probe._data import BYTE_EOS, default_train_texts

    config, train = dict(config or TINY_CONFIG), dict(train or TRAIN)
    texts = default_train_texts()
    if not texts:
        raise FileNotFoundError("advisor/data/probes/train/*.txt not found: the tiny model needs the shipped texts")
    stream: list[int] = []
    for p in texts:
        stream += list(p.read_text(encoding="utf-8").encode("utf-8")) + [BYTE_EOS]
    data = torch.tensor(stream, dtype=torch.long)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains faster on one thread, and reproducibly
    torch.manual_seed(train["seed"])
    model = AutoModelForCausalLM.from_config(build_hf_config(config), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=train["lr"], weight_decay=0.0)
    g = torch.Generator().manual_seed(train["seed"])
    seq, losses = train["seq_len"], []
    for step in range(train["steps"]):
        starts = torch.randint(0, len(data) - seq - 1, (train["batch"],), generator=g)
        batch = torch.stack([data[s:s + seq] for s in starts])
        for group in opt.param_groups:  # linear decay keeps the last steps stable
            group["lr"] = train["lr"] * (1 - step / train["steps"])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    torch.set_num_threads(threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update({k: v for k, v in config.items() if k not in cfg})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "training.json").write_text(json.dumps({"train": train, "first_loss": losses[0],
                                                   "last_loss": sum(losses[-10:]) / 10}, indent=2))
    return out


def tiny_model_dir(cache_root: str | Path | None = None) -> Path:
    """The trained tiny model's directory, trained on first use and cached (safe under parallel test workers)."""
    from advisor.runtime.probe._data import default_train_texts

    root = Path(cache_root or Path(tempfile.gettempdir()) / "vram-advisor-tiny")
    final = root / _key(default_train_texts(), TINY_CONFIG, TRAIN)
    if (final / "training.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".training-", dir=root))
    try:
        train_tiny_model(scratch)
        try:
            os.rename(scratch, final)  # atomic: a parallel worker that finished first wins
        except OSError:
            if not (final / "training.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final
