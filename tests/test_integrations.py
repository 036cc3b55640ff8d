"""MemoryGuardCallback in a real transformers Trainer run on the CPU with a tiny model."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.integrations import MemoryGuardCallback  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402

TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
        "max_position_embeddings": 4096}
SHORT, LONG = 32, 2048


class Batches(torch.utils.data.Dataset):
    """Two short sequences, then a long one: the long batch comes at step 3."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(0, 512, (n,), generator=g) for n in (SHORT, SHORT, LONG, SHORT)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def _run(tmp_path, budget_bytes):
    from advisor.runtime.simulate.tracker import LiveBytes

    d = tmp_path / "tiny"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY))
    spec = resolve_model(str(d))
    plan = Plan(method="full", precision="fp32", optimizer="adamw_torch", micro_batch=1, seq_len=SHORT)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TINY))
    static = sum(p.numel() * p.element_size() for p in model.parameters())
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1,
                                          max_steps=4, report_to=[], use_cpu=True, save_strategy="no",
                                          logging_strategy="no", dataloader_num_workers=0, optim="adamw_torch")
    tracker = LiveBytes()
    guard = MemoryGuardCallback(spec, plan, budget_bytes, longest_seq_len=LONG, first_seq_len=SHORT, check_steps=2,
                                memory_reader=lambda: static + tracker.peak.bytes)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Batches(), callbacks=[guard])
    with tracker:
        trainer.train()
    return guard, trainer.state.global_step


def _predicted(seq_len):
    from advisor.memory.training import estimate_training

    return estimate_training(resolve_model_tiny(), Plan(method="full", precision="fp32", seq_len=seq_len)).tensor_peak_bytes


def resolve_model_tiny():
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp()) / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return resolve_model(str(d))


def test_stops_before_the_long_batch_that_will_not_fit(tmp_path):
    budget = int((_predicted(SHORT) + _predicted(LONG)) / 2)  # the short batches fit, the long one does not
    guard, steps = _run(tmp_path, budget)
    assert guard.message and "longest batch" in guard.message and "seq 2,048" in guard.message
    assert guard.measured_peak and guard.projected_peak > budget * 0.95
    assert steps == 2, "the run must stop before step 3, where the long batch comes"


def test_lets_a_fitting_run_finish(tmp_path):
    guard, steps = _run(tmp_path, _predicted(LONG) * 4)
    assert guard.message is None and steps == 4
