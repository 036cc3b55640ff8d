"""Shared fixtures: every test runs with a private HOME / HF cache, never the user's."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import settings

# CI explores the same examples on every run (a failure there is reproducible, never a dice roll);
# local runs keep exploring new ones
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# the host budget a command detects is never the test machine's RAM (advisor/core/host.py): a machine with room for
# every plan, for module-scoped fixtures and child processes too; a test of the host rule sets its own
os.environ["ADVISOR_HOST_RAM"] = "1TiB"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("ADVISOR_MEMORY_CALIBRATION", str(tmp_path / "memory_calibration.json"))  # never the user's GPU calibration
    # probes' throughput calibration (advisor/speed/calibration.py) in the test's own folder
    monkeypatch.setenv("ADVISOR_SPEED_CALIBRATION", str(tmp_path / "speed_calibration.json"))
    # model descriptions derived at run time (advisor/core/architecture_store.py) in the test's own folder
    monkeypatch.setenv("ADVISOR_ARCHITECTURE_CACHE", str(tmp_path / "architectures"))
    yield


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer Qwen2 with a 300-token byte-level BPE tokenizer trained here, saved like a hub model."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("tiny-qwen2")
    lines = ["the quick brown fox jumps over the lazy dog", "weights gradients optimizer states activations",
             "fine tune a small model on the cpu for one step", "low rank adapters on quantized base weights"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines * 4, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(out)
    cfg = Qwen2Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    data = out / "data.jsonl"
    data.write_text("\n".join(json.dumps({"text": line}) for line in lines) + "\n")
    return out
