"""`advisor estimate`: the JSON contract, the human ledger, and every bad input as one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from advisor.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_exit(capsys, *argv):
    """run_cli, with argparse's own usage errors (SystemExit) as their exit code."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_qlora_json_contract(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--method", "qlora", "--seq-len", "1024",
                           "--micro-batch", "1", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["model"]["params_total"] == 7_615_616_512
    assert d["source"] == "estimated"
    assert set(d["ledger"]) >= {"weights", "quant_constants", "adapter_weights", "gradients", "optimizer_states",
                                "activations", "transient", "overhead"}
    assert d["tensor_peak_bytes"] < d["peak_bytes"]
    assert d["peak_bytes"] == sum(d["ledger"].values())
    # a QLoRA 7B step at seq 1024 needs more than its 4-bit weights (~5 GiB) and less than a 24 GiB card
    assert 5 * 2**30 < d["peak_bytes"] < 24 * 2**30
    assert "fits" not in d


def test_budget_gives_fits(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--method", "full", "--gpu-budget", "24GB",
                           "--json")
    d = json.loads(out)
    assert code == 0 and d["fits"] is False and d["budget"]["unit"] == "GiB"


def test_inference_kv_per_token(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--task", "inference", "--model", "qwen7b", "--json")
    d = json.loads(out)
    assert code == 0 and d["kv_cache_bytes_per_token"] == 57_344
    _, out, _ = run_cli(capsys, "estimate", "--task", "inference", "--model", "qwen7b", "--kv-dtype", "fp8", "--json")
    assert json.loads(out)["kv_cache_bytes_per_token"] == 28_672


def test_human_ledger_table(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--method", "lora", "--gpu-budget", "24GB")
    assert code == 0
    for text in ("Weights", "Saved activations", "Peak on the GPU", "GiB", "r16[q,k,v,o]"):
        assert text in out  # (the plan's brackets are text, not rich markup)
    verdict = _verdict(out)
    # the verdict the table prints is the one the JSON gives for the same command
    _, js, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--method", "lora", "--gpu-budget", "24GB", "--json")
    assert (verdict == "FITS") == json.loads(js)["fits"]


def _verdict(out: str) -> str:
    said = [v for v in ("DOES NOT FIT", "TIGHT", "FITS") if v in out]
    assert len(said) == 1, said
    return said[0]


@pytest.mark.parametrize("budget,verdict", [("80GB", "FITS"), ("16GB", "DOES NOT FIT")])
def test_human_verdict_follows_the_budget(capsys, budget, verdict):
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--method", "lora", "--gpu-budget", budget)
    assert code == 0
    assert _verdict(out) == verdict


@pytest.mark.parametrize("argv,flag", [
    (["--model", "qwen7", "--method", "lora"], "--model"),
    (["--model", "qwen7b", "--gpu-budget", "24XB"], "--gpu-budget"),
    (["--model", "qwen7b", "--gpu-budget", "-5GB"], "--gpu-budget"),
    (["--model", "qwen7b", "--gpu-budget", "0"], "--gpu-budget"),
    (["--model", "qwen7b", "--seq-len", "0"], "--seq-len"),
    (["--model", "qwen7b", "--micro-batch", "-2"], "--micro-batch"),
    (["--model", "qwen7b", "--lora-r", "0"], "--lora-r"),
    (["--model", "qwen7b", "--lora-targets", "nope_proj"], "--lora-targets"),
    (["--model", "qwen7b", "--method", "qlora", "--quantization", "int8"], "--quantization"),
    (["--model", "qwen7b", "--gpu", "rtx-9999"], "--gpu"),
    (["--model", "qwen7b", "--seq-len", "100000"], "--seq-len"),
    (["--model", "qwen7b", "--backend", "nope"], "--backend"),
    (["--model", "qwen7b", "--checkpoint-layers", "40"], "--checkpoint-layers"),
    (["--model", "qwen7b", "--optimizer", "lomo", "--grad-accum", "4"], "--grad-accum"),
    (["--model", "qwen7b", "--optimizer", "galore_adamw"], "--optimizer"),
    (["--model", "qwen7b", "--optimizer", "adamw_bnb_16bit"], "--optimizer"),
])
def test_bad_input(capsys, argv, flag):
    """Exit 2, one line on stderr naming the flag and the value, no traceback."""
    code, out, err = run_cli_exit(capsys, "estimate", *argv)
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert flag in lines[0] and "Traceback" not in err
    assert argv[argv.index(flag) + 1] in lines[0] if flag in argv else True


@pytest.mark.parametrize("argv,line", [
    (["estimate", "--model", "qwen7b", "--gpu-budget", "24"], "did you mean 24GB?"),
    (["tune", "--model", "qwen7b", "--gpu-budjet", "24GB"], "unrecognized arguments: --gpu-budjet; did you mean "
                                                            "--gpu-budget?"),
    (["estimate", "--model", "qwen7b", "--seqlen", "2048"], "did you mean --seq-len?"),
])
def test_a_likely_slip_gets_what_was_meant(capsys, argv, line):
    """A bare number of bytes as a budget and a misspelt flag: the one line says what was probably meant."""
    code, _, err = run_cli_exit(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and line in err, err


def test_bad_input_from_the_console_entry_point():
    """The real process: exit 2, one line on stderr, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "advisor", "estimate", "--model", "qwen7b", "--gpu-budget", "24XB"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1 and "--gpu-budget" in proc.stderr and "24XB" in proc.stderr


def test_broken_config_json_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{broken")
    proc = subprocess.run([sys.executable, "-m", "advisor", "estimate", "--model", str(d)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--model" in proc.stderr


def test_debug_shows_traceback():
    proc = subprocess.run([sys.executable, "-m", "advisor", "--debug", "estimate", "--model", "qwen7"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_help_does_not_import_torch():
    code = ("import sys, contextlib, io\n"
            "from advisor.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: main(['estimate', '--help'])\n"
            "    except SystemExit: pass\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False False"


def test_models_and_gpus_listing(capsys):
    code, out, _ = run_cli(capsys, "models", "--json")
    assert code == 0 and any(m["hf_id"] == "Qwen/Qwen2.5-7B-Instruct" for m in json.loads(out))
    code, out, _ = run_cli(capsys, "gpus", "--json")
    assert code == 0 and len(json.loads(out)["catalog"]) >= 13


def test_training_estimate_shows_predicted_throughput(capsys):
    # issue 14's check: tokens/s and seconds per optimizer step beside the ledger, with the terms
    code, out, _ = run_cli(capsys, "estimate", "--model", "llama3b", "--method", "lora", "--lora-r", "32",
                           "--lora-targets", "q_proj,v_proj", "--micro-batch", "4", "--seq-len", "256",
                           "--gpu", "l40s", "--json")
    d = json.loads(out)
    assert code == 0 and d["tokens_per_s"] > 0 and d["step_seconds"] > 0
    assert d["tokens_per_s"] == pytest.approx(4 * 256 / d["step_seconds"])
    assert sum(d["step_terms"].values()) == pytest.approx(d["step_seconds"])
    assert d["throughput"]["source"] == "predicted" and d["throughput"]["gpu"] == "NVIDIA L40S"
    code, out, _ = run_cli(capsys, "estimate", "--model", "llama3b", "--method", "lora", "--gpu", "l40s")
    assert "tokens/s (predicted)" in out and "s per optimizer step" in out and "Largest terms" in out


def test_estimate_without_a_gpu_says_so(capsys, monkeypatch):
    monkeypatch.setattr("advisor.core.catalog.detect_gpu", lambda index=0: None)
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--method", "lora", "--json")
    d = json.loads(out)
    assert code == 0 and d["tokens_per_s"] is None and d["step_seconds"] is None and d["step_terms"] == {}


def test_an_assumed_gpu_is_reported_as_assumed_everywhere(capsys, monkeypatch):
    """No --gpu and none detected, a budget given: the one rule of advisor.core.target assumes the catalog GPU the
    budget matches, and both the top level and the throughput block say it is assumed; a named GPU is not."""
    from advisor.core.catalog import gpu_for_budget

    monkeypatch.setattr("advisor.core.catalog.detect_gpu", lambda index=0: None)
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--gpu-budget", "24GB", "--json")
    d = json.loads(out)
    assert code == 0 and d["gpu_assumed"] is True and d["throughput"]["gpu_assumed"] is True
    assert d["throughput"]["gpu"] == d["gpu"]["name"] == gpu_for_budget(24 * 2**30).name
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--gpu", "l40s", "--gpu-budget", "24GB", "--json")
    d = json.loads(out)
    assert code == 0 and d["gpu_assumed"] is False and d["throughput"]["gpu_assumed"] is False


@pytest.mark.parametrize("optimizer", ["adamw_torch_fused", "adamw_torch", "adamw_torch_8bit", "adamw_torch_4bit",
                                       "adamw_8bit", "paged_adamw_8bit", "adafactor", "galore_adamw",
                                       "galore_adamw_8bit", "galore_adamw_layerwise", "apollo_adamw", "lomo",
                                       "adalomo"])
def test_every_optimizer_name_is_accepted(capsys, optimizer):
    code, out, _ = run_cli(capsys, "estimate", "--model", "qwen7b", "--method", "full", "--optimizer", optimizer,
                           "--gradient-checkpointing", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["plan"]["optimizer"] == optimizer and d["ledger"]["weights"] > 0


def test_levers_flags(capsys):
    """--checkpoint-layers K implies checkpointing; --activation-offload moves activations to the host;
    --optimizer-in-backward drops the gradient buffer (the estimate backend)."""
    base = ["estimate", "--model", "qwen7b", "--json"]
    _, out, _ = run_cli(capsys, *base, "--checkpoint-layers", "7")
    d = json.loads(out)
    assert d["plan"]["gradient_checkpointing"] and d["plan"]["checkpoint_layers"] == 7
    assert "ckpt7" in d["plan_short"]
    _, out, _ = run_cli(capsys, *base, "--gradient-checkpointing", "--activation-offload")
    d = json.loads(out)
    # each layer's input, bf16 (7 MiB), pinned in an 8 MiB block of torch's CachingHostAllocator
    assert d["host"]["activations"] == 28 * 8 * 2**20 and d["host_pinned_bytes"] == 28 * 8 * 2**20
    assert d["host_memory"]["pinned"] == {"activations": 28 * 8 * 2**20} and d["host_pageable_bytes"] == 0
    _, out, _ = run_cli(capsys, *base, "--method", "full", "--gradient-checkpointing", "--optimizer",
                        "adamw_torch_fused", "--optimizer-in-backward")
    d = json.loads(out)
    assert d["ledger"]["gradients"] < 2 * 2**30  # one tensor's gradient at a time, not 14 GiB
