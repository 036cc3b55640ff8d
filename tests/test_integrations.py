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

    return estimate_training(resolve_model_tiny(),
                             Plan(method="full", precision="fp32", seq_len=seq_len)).tensor_peak_bytes


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


# ----------------------------------------------------------------------------- evaluation


class Seqs(torch.utils.data.Dataset):
    def __init__(self, lengths, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(0, 512, (n,), generator=g) for n in lengths]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


EVAL_SEQ, EVAL_BATCH, EVAL_N = 1024, 8, 16


def _run_with_eval(tmp_path, budget_bytes, *, prediction_loss_only=False):
    from advisor.runtime.simulate.tracker import LiveBytes

    spec = resolve_model_tiny()
    plan = Plan(method="full", precision="fp32", optimizer="adamw_torch", micro_batch=1, seq_len=SHORT)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TINY))
    static = sum(p.numel() * p.element_size() for p in model.parameters())
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=1, per_device_eval_batch_size=EVAL_BATCH,
        max_steps=4, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
        eval_strategy="steps", eval_steps=2, prediction_loss_only=prediction_loss_only,
        dataloader_num_workers=0, optim="adamw_torch")
    tracker = LiveBytes()
    guard = MemoryGuardCallback(spec, plan, budget_bytes, longest_seq_len=SHORT, first_seq_len=SHORT,
                                eval_seq_len=EVAL_SEQ, eval_samples=EVAL_N, check_steps=2,
                                memory_reader=lambda: static + tracker.peak.bytes,
                                current_reader=lambda: static + tracker.live_bytes)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Seqs([SHORT] * 4),
                                   eval_dataset=Seqs([EVAL_SEQ] * EVAL_N, seed=1), callbacks=[guard])
    with tracker:
        trainer.train()
    return guard, trainer.state.global_step


def _eval_budget():
    """Room for the evaluation's forward (predicted) and a quarter more: not for the logits the Trainer keeps
    (16 x 1024 x 512 fp32 = 32 MiB, twice that while concatenating)."""
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    spec = resolve_model_tiny()
    plan = Plan(method="full", precision="fp32", seq_len=EVAL_SEQ, eval_batch=EVAL_BATCH)
    report = with_phases(spec, plan, None, get_backend("estimate")(spec, plan, None))
    return int(report.run_phases.phases["eval"].live_bytes * 1.25)


def test_stops_before_an_evaluation_that_will_not_fit(tmp_path):
    # training at seq 32 fits easily, and so would the evaluation's forward; the logits the Trainer keeps do not
    budget = _eval_budget()
    guard, steps = _run_with_eval(tmp_path, budget)
    assert guard.message and "before evaluation" in guard.message and "prediction_loss_only" in guard.message
    assert guard.evaluations == 0, "the evaluation that does not fit must not start"
    assert steps == 2 and guard.projected_eval_peak > budget * 0.95


def test_projects_an_evaluation_it_lets_run(tmp_path):
    # with prediction_loss_only the logits are dropped per batch: the same evaluation fits and runs
    guard, steps = _run_with_eval(tmp_path, _eval_budget(), prediction_loss_only=True)
    assert guard.message is None and steps == 4 and guard.evaluations == 2
    # the projection (made before the evaluation) covers what the evaluation really allocated
    assert guard.measured_eval_peak <= guard.projected_eval_peak * 1.05
    assert guard.projected_eval_peak <= guard.measured_eval_peak * 1.5
