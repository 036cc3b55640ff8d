"""`advisor preflight` on the seeds' configs written as advisor.yaml (and as axolotl YAML)."""

from __future__ import annotations

import json
import pytest

from advisor.core.catalog import resolve_model
from advisor.configs.export import export_plan
from advisor.core.plan import Plan
from cli_run import advisor_json

QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
SEED_FULL = Plan(method="full", precision="bf16", optimizer="adamw_torch", micro_batch=1, gradient_checkpointing=True,
                 seq_len=1024)
SEED_QLORA = Plan(method="qlora", quantization="nf4", double_quant=True, lora_r=16, lora_alpha=32, lora_targets=QKVO,
                  optimizer="paged_adamw_8bit", micro_batch=1, grad_accum=8, gradient_checkpointing=True, seq_len=1024)


def preflight(*argv):
    return advisor_json("preflight", *argv, "--json")


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    spec = resolve_model("qwen7b")
    full = export_plan(spec, SEED_FULL, root / "full", formats=["advisor"])["advisor"]
    qlora = export_plan(spec, SEED_QLORA, root / "qlora", formats=["advisor", "axolotl"])
    return {"full": full, "qlora": qlora["advisor"], "qlora_axolotl": qlora["axolotl"]}


@pytest.mark.slow
def test_seed_full_finetune_is_no_go_naming_optimizer_states_and_weights(configs):
    code, d, _ = preflight(str(configs["full"]), "--gpu-budget", "24GB")
    assert code == 1 and d["verdict"] == "NO-GO"
    mem = next(f for f in d["findings"] if f["check"] == "memory.fit")
    assert mem["severity"] == "error"
    text = (mem["title"] + mem["evidence"]).lower()
    assert "optimizer states" in text and "weights" in text
    assert mem["fixes"]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["qlora", "qlora_axolotl"])
def test_seed_qlora_is_go(configs, which):
    code, d, err = preflight(str(configs[which]), "--gpu-budget", "24GB")
    assert code == 0 and d["verdict"] == "GO", err
    mem = next(f for f in d["findings"] if f["check"] == "memory.fit")
    assert mem["severity"] == "ok" and d["memory"]["peak_bytes"] < 24 * 2**30 * 0.95


@pytest.mark.slow
def test_time_estimate_from_data(configs, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "word " * (50 + i)}) for i in range(200)))
    code, d, _ = preflight(str(configs["qlora"]), "--gpu-budget", "24GB", "--data", str(data), "--epochs", "2")
    t = next(f for f in d["findings"] if f["check"] == "time.estimate")
    assert d["hours"] and d["hours"] > 0 and "2" in t["evidence"]
    # the longest sequence in the data sets the memory check's length (chars/4 without a local tokenizer)
    mem = next(f for f in d["findings"] if f["check"] == "memory.fit")
    assert mem["data"]["seq_len"] < 1024


@pytest.mark.slow
def test_config_findings(tmp_path, configs):
    import yaml

    data = yaml.safe_load(configs["qlora"].read_text())
    data["training"]["learning_rate"] = 0.5
    data["lora"]["target_modules"] = ["q_proj", "not_a_module"]
    bad = tmp_path / "advisor.yaml"
    bad.write_text(yaml.safe_dump(data))
    code, d, _ = preflight(str(bad), "--gpu-budget", "24GB")
    checks = {f["check"]: f for f in d["findings"]}
    assert code == 1 and d["verdict"] == "NO-GO"
    assert checks["config.lora-targets"]["severity"] == "error"


@pytest.mark.slow
def test_bf16_on_a_gpu_without_it(configs):
    code, d, _ = preflight(str(configs["qlora"]), "--gpu", "t4")
    assert code == 1
    assert any(f["check"] == "config.bf16-unsupported" for f in d["findings"])


def test_bad_input_exit_2(tmp_path):
    code, _, err = preflight(str(tmp_path / "missing.yaml"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    broken = tmp_path / "broken.yaml"
    broken.write_text("training: [unclosed\n")
    code, _, err = preflight(str(broken))
    assert code == 2 and "Traceback" not in err


@pytest.mark.slow
def test_an_evaluation_that_does_not_fit_is_no_go_naming_the_phase(configs, tmp_path):
    import yaml

    cfg = yaml.safe_load(configs["qlora"].read_text())
    # Trainer evaluates 32 sequences of 1024 tokens at once: the 152k-vocabulary logits alone are ~47 GiB
    cfg["training"].update(eval_strategy="steps", eval_steps=100, per_device_eval_batch_size=32)
    path = tmp_path / "advisor.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, d, err = preflight(str(path), "--gpu-budget", "24GB")
    assert code == 1 and d["verdict"] == "NO-GO", err
    mem = next(f for f in d["findings"] if f["check"] == "memory.fit")
    assert mem["severity"] == "error" and "during eval" in mem["title"]
    assert any("per_device_eval_batch_size" in fix for fix in mem["fixes"])
    assert d["memory"]["run_peak_phase"] == "eval"


def test_a_margin_inside_the_measured_error_is_said():
    """A plan that fits with more than the 5% headroom, but would not fit at the backend's worst under-prediction
    on published runs (advisor/data/prediction_error.yaml), gets an info finding; the verdict stays GO."""
    from advisor.core.catalog import resolve_gpu
    from advisor.core.data_files import load_data_file
    from advisor.core.units import Budget
    from advisor.diagnosis.findings import verdict
    from advisor.diagnosis.preflight._run import memory_findings
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    spec, gpu = resolve_model("qwen0.5b"), resolve_gpu("a100-80gb")
    plan = Plan(method="lora", seq_len=512)
    report = with_phases(spec, plan, gpu, get_backend("estimate")(spec, plan, gpu))
    peak = report.run_peak_bytes
    worst = load_data_file("prediction_error.yaml")["estimated"]["most_under"]
    close = Budget(int(peak / 0.93), "GiB", "close")          # 7% left: past the headroom, inside the error
    found = memory_findings(report, close, 0.05, 512, None)
    assert [f.severity for f in found] == ["ok", "info"] and verdict(found) == "GO"
    band = found[1]
    assert band.check == "memory.error-band" and f"{-worst:.1%} under" in band.title and "--probe" in band.fixes[0]
    assert band.data["peak_at_most_under_bytes"] == int(peak / (1 + worst))
    roomy = Budget(int(peak / (1 + worst) * 1.01), "GiB", "roomy")  # fits even at the worst error
    assert [f.severity for f in memory_findings(report, roomy, 0.05, 512, None)] == ["ok"]


def test_headroom_fixes_leave_out_what_the_plan_already_does():
    from advisor.diagnosis.preflight._run import headroom_fixes

    done = headroom_fixes(SEED_QLORA.with_(loss="fused-linear"))  # micro-batch 1, checkpointing, 4-bit, fused loss
    assert len(done) == 1 and "advisor tune" in done[0]
    fresh = " ".join(headroom_fixes(Plan(method="lora", micro_batch=4)))
    for fix in ("micro-batch", "gradient checkpointing", "cross-entropy", "4-bit", "advisor tune"):
        assert fix in fresh


def test_a_fused_loss_whose_kernel_package_is_missing_is_said(tmp_path, monkeypatch):
    """Issue 41: GO for an advisor.yaml with use_liger_kernel: true (its fit counts the fused loss) on a machine
    without liger-kernel. Where the run would start (a GPU detected here) that is NO-GO; elsewhere a note."""
    import importlib.util

    from advisor.configs.export import export_plan
    from advisor.core.catalog import resolve_model
    from advisor.core.plan import Plan
    from advisor.diagnosis.preflight import _env

    real = importlib.util.find_spec
    monkeypatch.setattr(_env.importlib.util, "find_spec",
                        lambda name, *a: None if name == "liger_kernel" else real(name, *a))
    written = export_plan(resolve_model("qwen0.5b"), Plan(method="lora", loss="fused-linear"), tmp_path,
                          ["advisor", "trl"])
    code, d, _ = advisor_json("preflight", str(written["advisor"]), "--gpu", "rtx-4090", "--backend", "estimate",
                              "--json")
    kernel = [f for f in d["findings"] if f["check"] == "env.missing-package"]
    assert kernel and kernel[0]["severity"] == "info" and "liger-kernel" in kernel[0]["title"]
    # TRL's SFTTrainer fuses the head itself: nothing to install
    code, d, _ = advisor_json("preflight", str(written["trl"]), "--gpu", "rtx-4090", "--backend", "estimate", "--json")
    assert not [f for f in d["findings"] if f["check"] == "env.missing-package"]
    gpu_here = _env.check_loss_kernel(Plan(method="lora", loss="fused-linear"), "advisor", {}, gpu_here=True)
    assert gpu_here[0].severity == "error"
