"""`advisor estimate --task grpo|dpo`: the JSON shape (phases with generate, score and train; the generation
object), the text output's phase table, answers in seconds without a GPU, and bad input as one line naming the flag."""

from __future__ import annotations

import json
import time

import pytest

from advisor.cli import main

GRPO_QWEN2_T4 = ["--task", "grpo", "--model", "Qwen/Qwen2-7B-Instruct", "--gpu", "t4", "--method", "qlora",
                 "--double-quant", "--lora-r", "32", "--lora-targets", "all-linear", "--precision", "fp16",
                 "--gradient-checkpointing", "--optimizer", "paged_adamw_8bit", "--micro-batch", "8",
                 "--num-generations", "8", "--max-prompt-length", "256", "--max-completion-length", "256",
                 "--generation", "transformers", "--loss", "fused-linear"]
GRPO_LLAMA_VLLM = ["--task", "grpo", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "t4", "--method", "qlora",
                   "--generation", "vllm-colocate", "--vllm-gpu-memory-utilization", "0.6", "--num-generations", "6",
                   "--micro-batch", "6", "--max-prompt-length", "256", "--max-completion-length", "768",
                   "--gradient-checkpointing"]
DPO_LORA = ["--task", "dpo", "--model", "qwen7b", "--method", "lora", "--lora-r", "8", "--lora-targets", "all-linear",
            "--seq-len", "2048", "--gradient-checkpointing"]
DPO_FULL_ZERO3 = ["--task", "dpo", "--model", "qwen7b", "--method", "full", "--gpus", "4", "--sharding", "zero3",
                  "--seq-len", "8192", "--micro-batch", "4", "--gradient-checkpointing", "--attn-impl",
                  "flash_attention_2", "--padding-free"]
GENERATION_KEYS = {"engine", "pool_bytes", "weights_bytes", "kv_cache_bytes", "kv_tokens"}


def estimate(capsys, argv, *extra):
    start = time.perf_counter()
    code = main(["estimate", *argv, *extra])
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    return code, out, err, seconds


def test_grpo_generate_on_a_t4_json(capsys):
    code, out, _, seconds = estimate(capsys, GRPO_QWEN2_T4, "--json")
    assert code == 0 and seconds < 10
    d = json.loads(out)
    assert d["task"] == "grpo" and d["model"]["hf_id"] == "Qwen/Qwen2-7B-Instruct"
    assert {"generate", "score", "train"} <= set(d["phases"])
    gen = d["generation"]
    assert GENERATION_KEYS <= set(gen) and gen["engine"] == "transformers"
    assert gen["kv_cache_bytes"] == 57_344 * 8 * 512  # fp16 cache: 8 completions x (256 + 256) tokens
    assert gen["kv_tokens"] == 8 * 512 and gen["weights_bytes"] == 0
    # the peak is the run's highest phase; every phase is on the same card
    assert d["run_peak_bytes"] == max(p["peak_bytes"] for p in d["phases"].values() if p["included"])
    assert d["completion_tokens_per_s"] > 0 and d["throughput"]["tokens"] == "completion tokens"
    shares = {k: v["share"] for k, v in d["throughput"]["phases"].items()}
    assert abs(sum(shares.values()) - 1) < 1e-6 and shares["generate"] > 0 and shares["train"] > 0


def test_grpo_vllm_colocate_on_a_t4_json(capsys):
    code, out, _, seconds = estimate(capsys, GRPO_LLAMA_VLLM, "--json")
    assert code == 0 and seconds < 10
    d = json.loads(out)
    gen = d["generation"]
    assert GENERATION_KEYS <= set(gen) and gen["engine"] == "vllm-colocate"
    assert gen["pool_bytes"] == int(0.6 * d["gpu"]["memory_bytes"])
    assert gen["kv_cache_bytes"] > 0 and gen["kv_tokens"] >= gen["batch_tokens"] == 6 * 1024
    assert d["ledger"]["vllm_weights"] == gen["weights_bytes"]  # awake: vLLM's copy stays beside the trainer's
    assert d["phases"]["score"]["included"] and d["phases"]["sync"]["included"]
    # a 0.6 pool beside an 8B QLoRA trainer does not fit a 15 GiB T4, and the estimate says vLLM cannot start
    assert d["run_peak_bytes"] > d["gpu"]["memory_bytes"]
    assert any("cannot start" in n for n in d["phases"]["generate"]["notes"]) and gen["starts"] is False


def test_dpo_lora_json(capsys):
    code, out, _, seconds = estimate(capsys, DPO_LORA, "--json")
    assert code == 0 and seconds < 10
    d = json.loads(out)
    assert d["task"] == "dpo" and {"load", "precompute", "train", "save"} == set(d["phases"])
    assert d["generation"] is None and d["ledger"].get("reference_weights", 0) == 0
    assert d["extra"]["rows_per_forward"] == 2 and d["plan"]["reference"] == "adapter"


def test_dpo_full_zero3_json(capsys):
    code, out, _, seconds = estimate(capsys, DPO_FULL_ZERO3, "--json")
    assert code == 0 and seconds < 10
    d = json.loads(out)
    assert d["plan"]["reference"] == "copy"  # a full fine-tune's reference is a frozen copy (TRL's)
    # the copy, sharded like the policy: a quarter of the bf16 weights per GPU
    assert d["ledger"]["reference_weights"] == 7_615_616_512 * 2 // 4
    assert d["extra"]["gpus"] == 4 and d["extra"]["sharding"] == "zero3"


def test_the_text_output_shows_the_phase_table_and_vllm(capsys):
    code, out, _, _ = estimate(capsys, GRPO_LLAMA_VLLM)
    assert code == 0
    assert "Phases of the run" in out and "generate" in out and "score" in out and "sync" in out
    assert "Generation: vLLM pool" in out and "KV cache" in out and "Phases of the step" in out


@pytest.mark.parametrize("argv, flag", [
    (["--task", "grpo", "--model", "qwen0.5b", "--micro-batch", "3", "--num-generations", "8"], "--num-generations"),
    (["--task", "grpo", "--model", "qwen0.5b", "--generation", "vllm-colocate", "--vllm-gpu-memory-utilization", "2"],
     "--vllm-gpu-memory-utilization"),
    (["--task", "grpo", "--model", "qwen0.5b", "--micro-batch", "8", "--beta", "0.04", "--reference", "precomputed"],
     "--reference"),
    (["--task", "dpo", "--model", "qwen0.5b", "--padding-free"], "--padding-free"),
    (["--task", "grpo", "--model", "qwen0.5b", "--micro-batch", "8", "--max-completion-length", "40000"],
     "--max-completion-length"),
])
def test_bad_input_is_one_line_naming_the_flag(capsys, argv, flag):
    try:
        code = main(["estimate", *argv])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and flag in lines[0], err


def test_numbered_levels_parse(capsys):
    code, out, _, _ = estimate(capsys, ["--task", "grpo", "--model", "qwen0.5b", "--micro-batch", "8", "--generation",
                                        "vllm-colocate", "--vllm-sleep", "2", "--gpu", "a100-80gb", "--json"])
    d = json.loads(out)
    assert code == 0 and d["plan"]["vllm_sleep"] == 2 and "vllm_weights" not in d["ledger"]


def test_task_words(capsys):
    code, out, _, _ = estimate(capsys, ["--task", "train", "--model", "qwen0.5b", "--json"])
    assert code == 0 and json.loads(out)["plan"]["task"] == "sft"
    with pytest.raises(SystemExit):
        main(["estimate", "--task", "ppo", "--model", "qwen0.5b"])
    assert "--task" in capsys.readouterr().err
