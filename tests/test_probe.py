"""Real probes of tiny models on the CPU: full, LoRA, QLoRA; data; the result object; the backends."""

from __future__ import annotations

import json
import math

import pytest

from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.runtime.probe import ProbeResult, run_probe
from advisor.runtime.probe import _data
from advisor.runtime.simulate.tiny import tiny_spec

SEQ = 32


@pytest.fixture(scope="module")
def spec():
    return tiny_spec("qwen2", num_layers=2, vocab_size=512)


# LoRA dropout 0: the CPU's F.dropout saves noise in the input's dtype where CUDA saves a bool mask, and
# the simulation reproduces CUDA (advisor.runtime.simulate.runner.cuda_semantics); without dropout both are the same
PLANS = {
    "full": Plan(method="full", seq_len=SEQ, micro_batch=2),
    "lora": Plan(method="lora", seq_len=SEQ, grad_accum=2, lora_dropout=0.0),
    "qlora": Plan(method="qlora", quantization="nf4", seq_len=SEQ, gradient_checkpointing=True, lora_dropout=0.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_real_probe_runs_and_measures(spec, name):
    plan = PLANS[name]
    r = run_probe(spec, plan, device="cpu", steps=2, warmup=1, timeout=240)
    assert r.status == "ok", r.message
    assert r.steps_done == 3 and len(r.losses) == 3 and len(r.step_times_s) == 2
    assert all(math.isfinite(x) and 3.0 < x < 10.0 for x in r.losses)  # ~ln(512)=6.2 for random weights
    assert r.step_time_median_s > 0 and r.step_time_p90_s >= r.step_time_median_s * 0.999 or len(r.step_times_s) == 2
    assert r.tokens_per_s == pytest.approx(plan.tokens_per_step / r.step_time_median_s)
    assert r.alloc_retries is None  # a CUDA allocator counter
    # the peak holds at least every persistent tensor measured after the run
    persistent = sum(r.breakdown.values())
    assert r.peak_allocated_bytes >= persistent > 0
    assert len(r.step_peaks_bytes) == 3 and max(r.step_peaks_bytes) == r.peak_allocated_bytes
    if plan.peft:
        assert r.breakdown["adapter_weights"] > 0 and r.breakdown["gradients"] == r.breakdown["adapter_weights"]
    else:
        assert r.breakdown["gradients"] > 0 and r.breakdown["optimizer_states"] >= 2 * r.breakdown["gradients"] * 0.99
    if plan.four_bit:
        assert r.breakdown["quant_constants"] > 0
    assert r.versions["torch"] and r.versions["transformers"] and r.versions["peft"] and r.versions["bitsandbytes"]
    assert r.peak_reserved_bytes is None and r.nvml_peak_bytes is None and r.gpu_name is None
    assert r.fidelity_kl is None and any("random weights" in n for n in r.notes)
    assert ProbeResult.from_json(r.to_json()) == r
    from advisor.runtime.backends import available, get_backend

    if "simulate" in available():  # the same step traced under FakeTensorMode: the same peak within 2%
        sim = get_backend("simulate")(spec, plan, None)
        assert r.peak_allocated_bytes == pytest.approx(sim.tensor_peak_bytes, rel=0.02)
        assert r.peak_phase == sim.peak_phase


@pytest.mark.slow
def test_probe_trains_on_a_jsonl_file_with_the_byte_fallback(spec, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * 4})
                              for _ in range(4)) + "\n")
    r = run_probe(spec, Plan(method="lora", seq_len=SEQ), device="cpu", steps=1, warmup=0, timeout=240, data=str(data))
    assert r.status == "ok", r.message
    assert r.tokenizer == "bytes" and r.data == str(data)


def test_result_json_round_trip():
    r = ProbeResult(status="oom", message="x", device="cpu", model="m", plan=Plan().to_dict(), steps=2, warmup=1,
                    step_peaks_bytes=(1, 2), losses=(1.5,), notes=("a",), versions={"torch": "2"})
    back = ProbeResult.from_dict(json.loads(r.to_json()))
    assert back == r and isinstance(back.losses, tuple)


def test_bad_arguments_are_one_line_errors_naming_the_flag(spec, tmp_path):
    plan = Plan(method="lora", seq_len=SEQ)
    with pytest.raises(AdvisorInputError, match="--device"):
        run_probe(spec, plan, device="tpu")
    with pytest.raises(AdvisorInputError, match="--steps"):
        run_probe(spec, plan, steps=0)
    with pytest.raises(AdvisorInputError, match="--timeout"):
        run_probe(spec, plan, timeout=0)
    with pytest.raises(AdvisorInputError, match="--data: no such file"):
        run_probe(spec, plan, data=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"content": "no text field"}\n')
    with pytest.raises(AdvisorInputError, match='line 2 needs a string field "text"'):
        run_probe(spec, plan, data=str(bad))


def test_packing_and_byte_fallback(tmp_path):
    tok = _data.load_tokenizer(None, 512)
    assert tok.kind == "bytes" and tok.encode("hé") == [104, 195, 169]
    stream = _data.token_stream(["ab", "c"], tok)
    assert stream == [97, 98, 0, 99, 0]
    ids = _data.pack(list(range(10)), 4, 3)
    assert ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]  # reused from the start when short
    with pytest.raises(AdvisorInputError, match="fewer than one sequence"):
        _data.pack([1, 2], 4, 1)
    with pytest.raises(AdvisorInputError, match="256 ids"):
        _data.load_tokenizer(None, 100)
    txt = tmp_path / "a.txt"
    txt.write_text("one document\n\nstill the same one")
    assert _data.read_documents(txt) == ["one document\n\nstill the same one"]


def test_shipped_texts_exist_and_differ():
    train, ev = _data.default_train_texts(), _data.default_eval_texts()
    assert len(train) >= 3 and len(ev) >= 3
    assert sum(p.stat().st_size for p in ev) > 2000
    assert not {p.read_text() for p in train} & {p.read_text() for p in ev}


def test_the_model_directorys_tokenizer_is_used_when_present(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "[UNK]": 1, "the": 2, "river": 3, "rises": 4}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", unk_token="[UNK]").save_pretrained(tmp_path)
    tok = _data.load_tokenizer(str(tmp_path), 512)
    assert tok.kind == "model" and tok.eos_id == 0
    assert _data.token_stream(["the river rises", "the sea"], tok) == [2, 3, 4, 0, 2, 1, 0]
