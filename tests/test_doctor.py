"""`advisor doctor` on real error messages: the cause and at least one fix, with the advisor's numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from advisor.memory.training import estimate_training
from advisor.core.catalog import resolve_model
from advisor.diagnosis.doctor import diagnose, knowledge, parse_oom
from advisor.core.plan import Plan

# verbatim from PyTorch 2.x's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp)
REAL_OOM = """Traceback (most recent call last):
  File "train.py", line 88, in <module>
    trainer.train()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 23.64 GiB \
of which 412.44 MiB is free. Including non-PyTorch memory, this process has 23.23 GiB memory in use. Of the \
allocated memory 22.48 GiB is allocated by PyTorch, and 305.71 MiB is reserved by PyTorch but unallocated. If \
reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid \
fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""


def test_every_entry_is_complete():
    import re

    from dataclasses import fields

    declared = {f.name: f for f in fields(Plan)}
    for e in knowledge():
        assert e["id"] and e["symptom"] and e["cause"] and e["fixes"] and e["patterns"] and e["source"]
        for p in e["patterns"]:
            re.compile(p)
        for fix in e["fixes"]:
            if isinstance(fix, dict):  # a fix the run's plan may already apply: real Plan fields and values
                keys = {"fix", "done_when", "done_in_log", "first_in_log", "only_in_log"}
                assert set(fix) <= keys and fix["fix"], fix
                for pattern in (fix.get("done_in_log"), (fix.get("first_in_log") or {}).get("pattern"),
                                fix.get("only_in_log")):
                    if pattern:
                        re.compile(pattern)
                assert not fix.get("first_in_log") or fix["first_in_log"]["why"], fix
                for field, values in fix.get("done_when", {}).items():
                    assert field in declared, field
                    for value in values:
                        Plan(**{field: value, **({"method": "full"} if field == "optimizer" else {})})


def test_parse_oom_numbers():
    n = parse_oom(REAL_OOM)
    assert n["tried"] == int(1.16 * 2**30) and n["total"] == int(23.64 * 2**30)
    assert n["reserved_unallocated"] == int(305.71 * 2**20)


def test_real_oom_names_cause_fix_and_ledger():
    report = estimate_training(resolve_model("qwen7b"), Plan(method="full", gradient_checkpointing=True))
    findings = diagnose(REAL_OOM, report)
    oom = [f for f in findings if f.check == "log.cuda-oom"]
    assert oom and oom[0].fixes
    assert "optimizer states" in oom[0].evidence and "exceeds the card" in oom[0].evidence
    # 305 MiB reserved-unallocated could not have served a 1.16 GiB request: not a fragmentation problem
    assert not [f for f in findings if f.check == "log.fragmentation"]


def test_oom_fixes_leave_out_what_the_config_already_does():
    """A config that is already LoRA at micro-batch 1 is not told to train LoRA or lower the batch."""
    lora_b1 = Plan(method="lora", micro_batch=1, grad_accum=8)
    fixes = " | ".join(next(f for f in diagnose(REAL_OOM, plan=lora_b1) if f.check == "log.cuda-oom").fixes)
    assert "LoRA adapters" not in fixes and "per_device_train_batch_size" not in fixes
    assert "gradient checkpointing" in fixes and "4-bit" in fixes
    finding = next(f for f in diagnose(REAL_OOM, plan=lora_b1) if f.check == "log.cuda-oom")
    assert "already does it" in finding.evidence
    assert any("LoRA adapters" in fix for fix in finding.data["already_applied"])
    full = " | ".join(next(f for f in diagnose(REAL_OOM, plan=Plan(method="full", micro_batch=4))
                           if f.check == "log.cuda-oom").fixes)
    assert "LoRA adapters" in full and "per_device_train_batch_size" in full


def test_cli_doctor_reads_the_config(tmp_path):
    from advisor.configs.export import export_plan
    from cli_run import advisor_json

    export_plan(resolve_model("qwen0.5b"), Plan(method="lora", micro_batch=1, grad_accum=4), tmp_path / "out",
                formats=("advisor",))
    log = tmp_path / "train.log"
    log.write_text(REAL_OOM)
    code, d, err = advisor_json("doctor", log, "--config", tmp_path / "out" / "advisor.yaml", "--json")
    assert code == 1, err
    oom = d["findings"][0]
    assert not any("LoRA adapters" in fix or "per_device_train_batch_size" in fix for fix in oom["fixes"])


@pytest.mark.parametrize("log,check", [
    ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.002}", "log.nan-loss"),
    ("CUDA Setup failed despite GPU being available. Please run python -m bitsandbytes", "log.bnb-load-failure"),
    ("Some parameters are on the meta device because they were offloaded to the cpu.", "log.silent-cpu-offload"),
    ("RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
     "log.no-grad-checkpointing-peft"),
    ("ValueError: Target modules {'qkv'} not found in the base model.", "log.lora-targets-missing"),
])
def test_known_symptoms(log, check):
    assert check in {f.check for f in diagnose(log)}


def test_cli_doctor(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(REAL_OOM)
    proc = subprocess.run([sys.executable, "-m", "advisor", "doctor", str(log), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    d = json.loads(proc.stdout)
    assert d["findings"][0]["check"] == "log.cuda-oom" and d["findings"][0]["fixes"]
    clean = tmp_path / "clean.log"
    clean.write_text("step 1 loss 2.3\nstep 2 loss 2.1\n")
    assert subprocess.run([sys.executable, "-m", "advisor", "doctor", str(clean)], capture_output=True,
                          timeout=120).returncode == 0
    missing = subprocess.run([sys.executable, "-m", "advisor", "doctor", str(tmp_path / "nope.log")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "logfile" in missing.stderr


GRPO_LONG_OOM = """  File "/usr/lib/python3/site-packages/trl/trainer/grpo_trainer.py", line 1650, \
in _generate_and_score_completions
    old_per_token_logps, _ = self._get_per_token_logps_and_entropies(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 47.53 GiB \
of which 1.10 GiB is free.
"""
DPO_OOM = """  File "/usr/lib/python3/site-packages/trl/trainer/dpo_trainer.py", line 1402, in concatenated_forward
    outputs = model(input_ids, **model_kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB.
"""
LOGITS_OOM = """  File "trl/trainer/utils.py", line 1712, in selective_log_softmax
    logsumexp_values = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.28 GiB.
"""
NVIDIA_SMI_FLAT = "Changing QLoRA to LoRA or num_generations 4 to 8: nvidia-smi stays the same at 21 GB " \
                  "(gpu_memory_utilization 0.5)"


@pytest.mark.parametrize("log,check", [
    (GRPO_LONG_OOM, "log.rl-long-completion-oom"), (DPO_OOM, "log.rl-dpo-vs-sft"),
    (LOGITS_OOM, "log.rl-vocabulary-logits"), (NVIDIA_SMI_FLAT, "log.rl-vllm-reserved"),
])
def test_rl_failure_patterns(log, check):
    found = {f.check: f for f in diagnose(log)}
    assert check in found and found[check].fixes
    others = {"log.rl-long-completion-oom", "log.rl-dpo-vs-sft", "log.rl-vocabulary-logits"} - {check}
    assert not others & set(found), sorted(found)  # each failure recognised as itself
    assert ("log.cuda-oom" in found) == (check != "log.rl-vllm-reserved")


VIT_MASK_OOM = """  File "transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py", line 512, in _prepare_attention_mask
    attention_mask = torch.full([1, seq_length, seq_length], torch.finfo(inputs.dtype).min)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.15 GiB. GPU 0 has a total capacity of 47.50 GiB
"""
PIXEL_OOM = """  File "transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py", line 1350, in get_image_features
    image_embeds = self.visual(pixel_values, grid_thw=image_grid_thw)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.52 GiB.
"""


@pytest.mark.parametrize("log,check", [(VIT_MASK_OOM, "log.vlm-vit-attention-mask"),
                                       (PIXEL_OOM, "log.vlm-pixel-budget")])
def test_vision_language_failure_patterns(log, check):
    found = {f.check: f for f in diagnose(log)}
    assert check in found and found[check].fixes and "log.cuda-oom" in found
    assert not ({"log.vlm-vit-attention-mask", "log.vlm-pixel-budget"} - {check}) & set(found), sorted(found)


def test_rl_vllm_reserved_is_information_not_an_error():
    (f,) = [f for f in diagnose(NVIDIA_SMI_FLAT) if f.check == "log.rl-vllm-reserved"]
    assert f.severity == "info" and "max_memory_allocated" in " ".join(f.fixes)


def test_rl_fixes_leave_out_what_the_grpo_config_does_and_add_the_advisors_numbers(tmp_path):
    from advisor.configs.export import export_plan

    plan = Plan(task="grpo", method="qlora", quantization="nf4", gradient_checkpointing=True, micro_batch=1,
                grad_accum=8, generation="vllm-colocate", vllm_sleep=2, max_completion_length=2048)
    path = export_plan(resolve_model("qwen7b"), plan, tmp_path, ["trl"])["trl"]
    log = tmp_path / "train.log"
    log.write_text(GRPO_LONG_OOM)
    proc = subprocess.run([sys.executable, "-m", "advisor", "doctor", str(log), "--config", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    (f,) = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "log.rl-long-completion-oom"]
    fixes = " | ".join(f["fixes"])
    assert "sleep" not in fixes and "gradient checkpointing" not in fixes and "per_device" not in fixes
    assert "max_completion_length" in fixes
    assert "every completion at max_completion_length 2,048" in f["evidence"] and "vLLM's pool" in f["evidence"]


PEFT_LOSS_OOM = """Traceback (most recent call last):
  File "/work/train.py", line 88, in <module>
    trainer.train()
  File "/usr/lib/python3.11/site-packages/transformers/trainer.py", line 2328, in train
    return inner_training_loop(
  File "/usr/lib/python3.11/site-packages/peft/peft_model.py", line 1719, in forward
    return self.base_model(
  File "/usr/lib/python3.11/site-packages/transformers/loss/loss_utils.py", line 58, in ForCausalLMLoss
    logits = logits.float()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has a total capacity of 23.65 GiB \
of which 3.12 GiB is free. Including non-PyTorch memory, this process has 20.52 GiB memory in use. Of the allocated \
memory 19.90 GiB is allocated by PyTorch, and 178.63 MiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
"""


def test_an_oom_in_the_loss_of_a_peft_run_points_at_the_logits_not_at_lora():
    """Issue 41: the traceback runs through peft (adapters are trained) and stops at loss_utils' logits.float(): the
    fused or chunked loss comes first, saying why; LoRA is not offered; PyTorch's expandable_segments hint is named;
    the excerpt ends at a word."""
    oom = next(f for f in diagnose(PEFT_LOSS_OOM) if f.check == "log.cuda-oom")
    assert oom.fixes[0].startswith("Use a fused or chunked cross-entropy loss") and "logits.float()" in oom.fixes[0]
    assert not any("LoRA adapters" in fix for fix in oom.fixes)
    assert any("LoRA adapters" in fix for fix in oom.data["already_applied"])
    assert any("expandable_segments:True" in fix for fix in oom.fixes)
    log_part = oom.evidence.split(";")[0]
    assert log_part.endswith(" …") and log_part[:-2].rstrip()[-1].isalnum() or len(log_part) < 205
    # without the hint in the log, the allocator setting is not offered
    plain = REAL_OOM.replace("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "it")
    plain = plain.replace("expandable_segments", "")
    assert not any("expandable_segments" in fix for f in diagnose(plain) if f.check == "log.cuda-oom"
                   for fix in f.fixes)


def test_a_log_from_another_card_than_the_configs_is_said():
    from advisor.core.catalog import resolve_gpu

    other = [f for f in diagnose(PEFT_LOSS_OOM, gpu=resolve_gpu("a100-80gb")) if f.check == "log.other-card"]
    assert len(other) == 1 and other[0].severity == "warning" and "23.65 GiB" in other[0].title
    assert not [f for f in diagnose(PEFT_LOSS_OOM, gpu=resolve_gpu("rtx-4090")) if f.check == "log.other-card"]
