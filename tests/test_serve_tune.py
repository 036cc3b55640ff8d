"""`advisor tune --task inference`: the 7B / 24 GB plan, the exports checked against vLLM's documented flags
(tests/data/vllm_serve_flags.yaml) and transformers' GenerationConfig, the space file, bad input."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from advisor.cli import main

FLAGS = yaml.safe_load((Path(__file__).parent / "data" / "vllm_serve_flags.yaml").read_text())["flags"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def plan_7b_24gb(tmp_path_factory):
    import io
    from contextlib import redirect_stdout

    out_dir = tmp_path_factory.mktemp("export")
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b", "--gpu", "rtx-4090",
                     "--backend", "estimate", "--json", "--export", str(out_dir)])
    assert code == 0
    return json.loads(buf.getvalue()), out_dir


def test_7b_on_24gb_fits_the_budget(plan_7b_24gb):
    d, _ = plan_7b_24gb
    best = d["best"]
    led = best["ledger"]
    per_token = {"bf16": 57_344, "fp8": 28_672}[best["plan"]["kv_dtype"]]
    assert d["kv_cache_bytes_per_token"] == per_token
    assert led["kv_cache"] == d["tokens_in_flight"] * per_token
    assert d["tokens_in_flight"] >= best["plan"]["concurrency"] * best["plan"]["context_len"]
    # tokens in flight x KV per token + weights + overhead (and everything else) fits the budget with headroom
    assert sum(led.values()) == best["peak_bytes"] <= d["budget"]["bytes"] * (1 - d["headroom"])
    assert best["peak_bytes"] <= d["limit_bytes"] == int(d["gpu_memory_utilization"] * d["gpu"]["memory_bytes"])
    assert best["quality"] >= d["space"]["fixed"]["quality_floor"]
    assert best["plan"]["concurrency"] >= 16, "a 24 GB card serves many 4k sequences of a 7B model"


def _script_args(path: Path) -> dict[str, str]:
    text = path.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("exec vllm serve"))
    toks = shlex.split(line)[4:]
    toks = [t for t in toks if t != "$@"]
    return dict(zip(toks[::2], toks[1::2]))


def test_vllm_script_consistent_with_plan(plan_7b_24gb):
    d, out = plan_7b_24gb
    plan, led = d["best"]["plan"], d["best"]["ledger"]
    args = _script_args(out / "serve_vllm.sh")
    assert args == {k: str(v) for k, v in json.loads((out / "vllm_args.json").read_text())["args"].items()}
    assert int(args["--max-model-len"]) == plan["context_len"]
    assert int(args["--max-num-seqs"]) == plan["concurrency"]
    assert int(args["--block-size"]) == plan["block_size"]
    assert args["--kv-cache-dtype"] == {"bf16": "auto", "fp8": "fp8"}[plan["kv_dtype"]]
    util = float(args["--gpu-memory-utilization"])
    assert (util * d["gpu"]["memory_bytes"]
            >= led["weights"] + led["quant_constants"] + led["kv_cache"] + led["transient"])
    assert util * d["gpu"]["memory_bytes"] <= d["budget"]["bytes"]
    if plan["weight_format"] == "int4":
        assert args["--quantization"] in ("awq_marlin", "gptq_marlin")
    assert int(args["--max-num-batched-tokens"]) >= int(args["--max-num-seqs"])
    for flag, value in args.items():
        assert flag in FLAGS, flag
        _check_flag(flag, value)


def _check_flag(flag, value):
    spec = FLAGS[flag]
    if "choices" in spec:
        assert value in [str(c) for c in spec["choices"]], (flag, value)
    else:
        lo, hi = spec["range"]
        v = float(value)
        assert (v > lo if spec.get("exclusive_low") else v >= lo) and (hi is None or v <= hi), (flag, value)


@pytest.mark.parametrize("overrides", [[], ["weight_format=bf16", "kv_dtype=bf16"], ["weight_format=fp8"],
                                       ["weight_format=int8"], ["weight_format=int4", "quant_method=gptq"]])
def test_every_exported_flag_is_a_documented_vllm_flag(tmp_path, capsys, overrides):
    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b",
                             "--backend", "estimate", "--json", "--export", str(tmp_path), *overrides)
    assert code == 0, err
    args = _script_args(tmp_path / "serve_vllm.sh")
    assert {"--gpu-memory-utilization", "--max-model-len", "--max-num-seqs", "--kv-cache-dtype",
            "--block-size"} <= set(args)
    for flag, value in args.items():
        assert flag in FLAGS, f"{flag} is not in the validated vLLM flag list"
        _check_flag(flag, value)
    fmt = json.loads(out)["best"]["plan"]["weight_format"]
    assert ("--quantization" in args) == (fmt not in ("bf16", "fp16"))


def test_generation_settings_load_in_transformers(plan_7b_24gb):
    from transformers import GenerationConfig

    d, out = plan_7b_24gb
    gen = json.loads((out / "generation_config.json").read_text())
    cfg = GenerationConfig(**gen)
    cfg.validate(strict=True)
    assert cfg.cache_implementation == "static"
    tf = json.loads((out / "transformers_serving.json").read_text())
    assert 1 <= tf["batch_size"] <= d["best"]["plan"]["concurrency"]  # the static cache holds fewer (not paged)
    assert tf["max_cache_len"] == d["best"]["plan"]["context_len"] == tf["max_prompt_tokens"] + gen["max_new_tokens"]


def test_pinned_context_and_concurrency(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b",
                           "--context-len", "8192", "--concurrency", "8", "--backend", "estimate", "--json",
                           "--export", str(tmp_path))
    d = json.loads(out)
    assert code == 0 and d["best"]["plan"]["context_len"] == 8192 and d["best"]["plan"]["concurrency"] == 8
    # the pinned values reach the exported `vllm serve` flags, and every flag is one vLLM documents
    args = _script_args(tmp_path / "serve_vllm.sh")
    assert args["--max-model-len"] == "8192" and args["--max-num-seqs"] == "8"
    for flag, value in args.items():
        assert flag in FLAGS, flag
        _check_flag(flag, value)


def test_quality_floor_rules_out_int4(capsys):
    code, out, _ = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b",
                           "--backend", "estimate", "--json", "quality_floor=0.99")
    d = json.loads(out)
    assert code == 0 and d["best"]["plan"]["weight_format"] != "int4" and d["best"]["quality"] >= 0.99


def test_bf16_kv_halves_capacity_against_fp8(capsys):
    got = {}
    for kv in ("bf16", "fp8"):
        code, out, _ = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b",
                               "--context-len", "4096", "--backend", "estimate", "--json", "weight_format=int4",
                               f"kv_dtype={kv}", "max_concurrency=4096")
        got[kv] = json.loads(out)["best"]["plan"]["concurrency"]
    assert 1.9 <= got["fp8"] / got["bf16"] <= 2.1


@pytest.mark.parametrize("argv,flag", [
    (["--gpu-budget", "2GB"], "--gpu-budget"),
    (["--gpu-budget", "24GB", "--context-len", "1000000"], "--context-len"),
    (["--gpu-budget", "24GB", "--concurrency", "0"], "--concurrency"),
    (["--gpu-budget", "24GB", "kv_dtype=int2"], "search.kv_dtype"),
    (["--gpu-budget", "24GB", "bogus=1"], "bogus"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, flag):
    try:
        code, out, err = run_cli(capsys, "tune", "--task", "inference", "--model", "qwen7b", "--backend", "estimate",
                                 *argv)
    except SystemExit as e:  # argparse rejects a type error itself
        code, err = e.code, capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("advisor") or "error" in ln]
    assert len(lines) == 1 and flag in lines[0], err


def test_space_file_loads_and_is_headed():
    from advisor.search.serve_space import SPACES_DIR, load_serve_space

    text = (SPACES_DIR / "inference.yaml").read_text()
    assert text.startswith("#") and "advisor tune --task inference" in text.split("name:")[0]
    s = load_serve_space("inference")
    assert s.fixed["quality_floor"] > 0 and set(s.search["weight_format"]) >= {"bf16", "fp8", "int8", "int4"}
    assert set(s.search["kv_dtype"]) == {"bf16", "fp8"}


def test_priors_cover_every_choice_of_the_space():
    from advisor.core.serve_priors import quality_prior
    from advisor.search.serve_space import load_serve_space

    s = load_serve_space("inference")
    for wf in s.search["weight_format"]:
        for g in (128, 64, 32):  # published checkpoints' group sizes (advisor/data/serving_checkpoints.yaml)
            for kv in s.search["kv_dtype"]:
                assert 0.9 < quality_prior(wf, g, kv) <= 1.0
    assert quality_prior("int4", 32, "bf16") > quality_prior("int4", 128, "bf16")


@pytest.mark.parametrize("model,gpu,budget,overrides", [
    ("gpt-oss-20b", "a100-80gb", "80GB", ["weight_format=mxfp4"]),
    ("qwen3-30b-a3b", "h100-sxm", "80GB", []),
    ("gemma-3-4b", "rtx-4090", "24GB", []),
])
def test_moe_and_new_attention_export_to_vllm(tmp_path, capsys, model, gpu, budget, overrides):
    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", budget, "--gpu", gpu, "--model",
                             model, "--backend", "estimate", "--json", "--export", str(tmp_path), *overrides)
    assert code == 0, err
    d = json.loads(out)
    plan, led = d["best"]["plan"], d["best"]["ledger"]
    script = (tmp_path / "serve_vllm.sh").read_text()
    args = _script_args(tmp_path / "serve_vllm.sh")
    for flag, value in args.items():
        assert flag in FLAGS, flag
        _check_flag(flag, value)
    # one GPU: vLLM's expert parallelism (EP size = TP x DP) has nothing to spread
    assert "--enable-expert-parallel" not in args
    assert led["kv_cache"] == plan["concurrency"] * d["kv_cache_bytes_per_sequence"]
    tf = json.loads((tmp_path / "transformers_serving.json").read_text())
    if model == "gpt-oss-20b":
        assert plan["weight_format"] == "mxfp4" and "--quantization" not in args  # vLLM reads the checkpoint's
        assert "MXFP4" in script and "all 32 experts" in script
        assert tf["attn_implementation"] == "eager"  # the class refuses sdpa (attention sinks)
        assert led["weights"] + led["quant_constants"] < 14 * 2**30
    if model == "qwen3-30b-a3b":
        assert "all 128 experts" in script
    if model == "gemma-3-4b":  # sliding-window layers: the cache per sequence is far below every layer x every token
        assert d["kv_cache_bytes_per_sequence"] < 0.5 * d["kv_cache_bytes_per_token"] * plan["context_len"]
        assert "by layer kind" in script


def _model_line(path: Path) -> str:
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith("MODEL="))
    return line.split(":-", 1)[1].rstrip('}"')


def test_a_quantized_plan_serves_a_checkpoint_in_its_format(tmp_path, capsys):
    """An AWQ plan points MODEL at the published AWQ checkpoint and takes its group size (Qwen's: 128)."""
    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b",
                             "--backend", "estimate", "--json", "--export", str(tmp_path), "weight_format=int4")
    assert code == 0, err
    plan = json.loads(out)["best"]["plan"]
    assert plan["group_size"] == 128 and plan["quant_method"] == "awq"
    assert _model_line(tmp_path / "serve_vllm.sh") == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    assert _script_args(tmp_path / "serve_vllm.sh")["--quantization"] == "awq_marlin"
    assert json.loads((tmp_path / "vllm_args.json").read_text())["model"] == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    assert json.loads((tmp_path / "transformers_serving.json").read_text())["model"] == "Qwen/Qwen2.5-7B-Instruct-AWQ"


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_a_quantized_plan_without_a_published_checkpoint_says_how_to_make_it(tmp_path, capsys, fmt):
    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--model",
                             "mistral-7b-v0.3", "--backend", "estimate", "--json", "--export", str(tmp_path),
                             f"weight_format={fmt}")
    assert code == 0, err
    script = (tmp_path / "serve_vllm.sh").read_text()
    scheme = {"int4": "W4A16", "int8": "W8A16"}[fmt]
    assert _model_line(tmp_path / "serve_vllm.sh") == f"./Mistral-7B-v0.3-{scheme}"
    assert "from llmcompressor import oneshot" in script and f'scheme="{scheme}"' in script
    assert f'output_dir="{_model_line(tmp_path / "serve_vllm.sh")}"' in script
    # a compressed-tensors checkpoint: vLLM's flag for it (never awq_marlin on a checkpoint that is not AWQ)
    assert _script_args(tmp_path / "serve_vllm.sh")["--quantization"] == "compressed-tensors"


def test_the_group_size_is_not_searched(capsys):
    code, _, err = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b",
                           "--backend", "estimate", "group_size=32")
    assert code == 2 and "group_size" in err and "checkpoint" in err


def test_the_transformers_batch_fits_the_memory(tmp_path, capsys):
    """transformers' static cache is not paged: its batch is the largest that fits, not vLLM's concurrency."""
    from dataclasses import replace

    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.memory.inference import ServePlan, estimate_inference

    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--gpu", "rtx-4090",
                             "--model", "qwen7b", "--backend", "estimate", "--json", "--export", str(tmp_path))
    assert code == 0, err
    d = json.loads(out)
    hf = json.loads((tmp_path / "transformers_serving.json").read_text())
    plan = ServePlan(**d["best"]["plan"])
    plan = replace(plan, kv_dtype="bf16")
    model, gpu = resolve_model("qwen7b"), resolve_gpu("rtx-4090")
    batch = hf["batch_size"]
    assert 1 <= batch < d["best"]["plan"]["concurrency"]
    fits = estimate_inference(model, replace(plan, concurrency=batch), gpu, engine="hf").peak_bytes
    over = estimate_inference(model, replace(plan, concurrency=batch + 1), gpu, engine="hf").peak_bytes
    assert fits <= d["limit_bytes"] < over
