"""`advisor tune` end to end on real Optuna studies in SQLite files (estimate backend: milliseconds a trial)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.cli import main
from cli_run import advisor


def tune(tmp_path, capsys, *extra):
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--json",
                 "--reports-dir", str(tmp_path / "reports"), *extra])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


@pytest.mark.slow
def test_qwen7b_24gb_recommends_peft_and_rejects_full(tmp_path, capsys):
    code, d = tune(tmp_path, capsys, "--trials", "25")
    assert code == 0
    assert d["n_trials"] == 25 and d["n_pruned"] >= 1
    best = d["best"]
    assert best["plan"]["method"] in ("lora", "qlora")
    # an answer at the edge is simulated
    assert best["peak_bytes"] <= 24 * 2**30 * 0.95 and best["source"] in ("estimated", "simulated")
    assert best["tokens_per_s"] > 0
    # the predicted step-time terms travel with the answer, and the explanation names its largest ones
    p = best["plan"]
    assert best["tokens_per_s"] == pytest.approx(
        p["micro_batch"] * p["seq_len"] * p["grad_accum"] / sum(best["step_terms"].values()))
    assert best["step_terms"]["matmul"] > 0
    assert any(line.startswith("Its predicted step") for line in d["explanation"])
    assert d["pareto"] and d["exports"] == {}
    full = [t for t in d["trials"] if t["plan"].get("method") == "full" and t["state"] == "pruned"]
    assert full and all(t["reason"] for t in full)
    assert any("Full fine-tuning rejected" in line for line in d["explanation"])
    # conditional knobs: the sampler proposes only valid plans, no trial is spent on an invalid one
    assert not [t for t in d["trials"] if (t["reason"] or "").startswith("invalid")]
    # the usual recipe went first (the baseline), then the ladder in the seeds' order
    labelled = [t["ladder"] for t in sorted(d["trials"], key=lambda t: t["number"]) if t["ladder"]]
    assert labelled[0].startswith("recipe: the usual recipe")
    assert d["recipe"]["number"] == 0 and d["recipe"]["plan"]["lora_targets"] == "all-linear"
    rungs = [int(label[0]) for label in labelled[1:] if not label.startswith("polish:")]
    assert rungs[:3] == [0, 1, 1] and rungs == sorted(rungs)
    # no lever without a quality entry, no lever changing the dynamics while a plan fits without it
    assert not any((t["reason"] or "").startswith("no quality evidence") for t in d["trials"])
    assert best["plan"]["optimizer"] not in ("lomo", "adalomo", "sgd", "adafactor")


@pytest.mark.slow
def test_rerun_continues_to_the_planned_count(tmp_path, capsys):
    _, first = tune(tmp_path, capsys, "--trials", "10")
    _, second = tune(tmp_path, capsys, "--trials", "16")
    assert first["n_trials"] == 10 and second["n_trials"] == 16
    before = {t["number"]: t["plan_short"] for t in first["trials"] if t["state"] in ("complete", "pruned")}
    after = {t["number"]: t["plan_short"] for t in second["trials"] if t["state"] in ("complete", "pruned")}
    assert all(after[n] == p for n, p in before.items()), "finished trials were changed or lost"


def _finished(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as con:
            return con.execute("select count(*) from trials where state in ('COMPLETE','PRUNED')").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.slow
def test_sigkill_midway_then_rerun_finishes_without_repeats(tmp_path):
    reports = tmp_path / "reports"
    cmd = [sys.executable, "-m", "advisor", "tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend",
           "estimate", "--trials", "40", "--json", "--reports-dir", str(reports), "--study", "killed"]
    db = reports / "killed" / "study.db"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    while _finished(db) < 5 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = _finished(db)
    assert 5 <= killed_at < 40, "the kill should land midway"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    finished = [t for t in d["trials"] if t["state"] in ("complete", "pruned")]
    evaluated = [t for t in finished if t["duplicate_of"] is None and not t["ladder"].startswith("polish:")]
    assert len(evaluated) == 40 == d["n_trials"]
    # a plan is evaluated once; a repeat proposal is answered from the first and says so
    assert len({t["plan_short"] for t in evaluated}) == 40
    for t in finished:
        if t["duplicate_of"] is not None:
            assert "same plan as" in t["reason"] and t["seconds"] == 0.0


def test_budget_below_smallest_plan(tmp_path):
    code, _, err = advisor("tune", "--gpu-budget", "2GB", "--model", "qwen7b", "--backend", "estimate",
                           "--reports-dir", tmp_path)
    assert code == 2
    line = err.strip()
    assert len(line.splitlines()) == 1 and "--gpu-budget" in line and "smallest plan" in line and "GB" in line
    assert "over; its largest part, weights, is" in line


@pytest.mark.slow
def test_a_mixture_of_experts_over_the_budget_names_its_weights(tmp_path, capsys):
    # Qwen3-30B-A3B's stacked experts stay bf16 under 4-bit loading (advisor.memory.experts): no plan of the
    # default space fits 24 GB, and only one plan is simulated to say so (the others' weights alone are over)
    # ... on a host that cannot hold ZeRO-3's offloaded parameters either, which the error says
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen30b-a3b", "--backend", "estimate",
                 "--host-budget", "64GB", "--reports-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "smallest plan" in err and "its largest part, weights, is 55.60 GiB alone" in err
    assert "zero3_cpu" in err and "would fit the GPU, but its host peak" in err and "--host-budget" in err


@pytest.mark.parametrize("argv,flag", [
    (["--backend", "cuda"], "--backend"),
    (["method=sideways"], "search.method"),
    (["--space", "nope"], "--space"),
    (["--headroom", "1.5"], "--headroom"),
])
def test_bad_tune_input(tmp_path, argv, flag):
    proc = subprocess.run([sys.executable, "-m", "advisor", "tune", "--gpu-budget", "24GB", "--model", "qwen7b",
                           "--reports-dir", str(tmp_path), *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and flag in proc.stderr and "Traceback" not in proc.stderr


def test_other_study_settings_refused_without_losing_the_study(tmp_path, capsys):
    tune(tmp_path, capsys, "--trials", "5", "--study", "mine")
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--json",
                 "--reports-dir", str(tmp_path / "reports"), "--study", "mine", "--space", "qlora"])
    assert code == 2
    assert "--space: study 'mine' was made with space default, not qlora" in capsys.readouterr().err
    _, again = tune(tmp_path, capsys, "--trials", "5", "--study", "mine")
    assert again["n_trials"] == 5


@pytest.mark.slow
def test_cpu_backend_runs_real_probes_on_a_tiny_model(tmp_path, capsys):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
        "max_position_embeddings": 4096}))
    code = main(["tune", "--gpu-budget", "1GB", "--model", str(model), "--backend", "cpu", "--trials", "3",
                 "--probe-steps", "1", "--json", "--reports-dir", str(tmp_path / "reports"), "seq_len=64",
                 "micro_batch=[1,2]"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["n_trials"] == 3 and d["backend"] == "cpu"
    probed = [t for t in d["trials"] if t["state"] == "complete"]
    assert probed and all(t["source"] == "measured" and t["tokens_per_s_source"] == "measured" for t in probed)
    assert d["best"]["source"] == "measured" and d["best"]["peak_bytes"] < 2**30


def small(tmp_path, capsys, *extra):
    """A quick study of qwen0.5b on 24 GB (estimate backend, 3 trials), as --json prints it: (exit code, result,
    stderr)."""
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "estimate", "--json",
                 "--trials", "3", "--reports-dir", str(tmp_path / "reports"), *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else None, out.err


@pytest.mark.slow
def test_another_gpu_is_another_study_and_an_explicit_study_of_the_first_is_refused(tmp_path, capsys):
    """A study answers one question: the same command on another GPU answers for that GPU, in a study of its own,
    and naming the first study with the new GPU is refused in one line, the study left as it was."""
    code, first, _ = small(tmp_path, capsys)
    assert code == 0 and first["gpu"] == {"name": "NVIDIA GeForce RTX 3090", "assumed": True}
    code, other, _ = small(tmp_path, capsys, "--gpu", "rtx-4090")
    assert code == 0 and other["study"] != first["study"] and other["gpu"]["name"] == "NVIDIA GeForce RTX 4090"
    assert other["n_trials"] == 3 and other["best"]["tokens_per_s"] != first["best"]["tokens_per_s"]
    code, refused, err = small(tmp_path, capsys, "--gpu", "rtx-4090", "--study", first["study"], "--trials", "5")
    assert code == 2 and refused is None and len(err.strip().splitlines()) == 1
    assert (f"--gpu: study {first['study']!r} was made with gpu NVIDIA GeForce RTX 3090, not NVIDIA GeForce RTX 4090"
            in err)
    _, again, _ = small(tmp_path, capsys)
    assert again["study"] == first["study"] and again["n_trials"] == 3  # untouched: no trial was added


def test_a_resumed_study_explains_its_answer_as_the_run_that_made_it(tmp_path, capsys):
    _, first, _ = small(tmp_path, capsys, "--gpus", "2")
    _, again, _ = small(tmp_path, capsys, "--gpus", "2")
    assert again["study"] == first["study"] and again["explanation"] == first["explanation"]
    assert again["best"] == first["best"]


@pytest.mark.parametrize("argv,says", [
    (["--gpu", "a10g", "--gpu-budget", "24GB"], "--gpu-budget: more than the NVIDIA A10G has: 22.5 GiB per GPU "
                                                "(got '24GB')"),
    (["--gpu-budget", "24TB"], "--gpu-budget: more than the largest catalog GPU (NVIDIA B200) has: 179.1 GiB per GPU "
                               "(got '24TB')"),
])
def test_a_budget_the_card_does_not_have_is_refused(tmp_path, capsys, argv, says):
    code = main(["tune", "--model", "qwen0.5b", "--backend", "estimate", "--reports-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_the_nominal_size_of_a_card_is_its_budget(tmp_path):
    from advisor.core.target import resolve_target

    for gpu, budget in (("rtx-4090", "24GB"), ("h100-sxm", "80GB"), ("a10g", "22.5GB")):
        assert resolve_target("qwen0.5b", gpu=gpu, gpu_budget=budget, detect=False).budget.text == budget


def test_a_rejected_budget_leaves_no_study_folder(tmp_path, capsys):
    code = main(["tune", "--gpu-budget", "1GB", "--model", "qwen7b", "--backend", "estimate",
                 "--reports-dir", str(tmp_path / "reports")])
    assert code == 2 and "smallest plan" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_report_without_a_study_says_so_in_one_line(tmp_path, capsys):
    code = main(["report", "--reports-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "STUDY: name a study directory" in err and "None" not in err


def test_tune_takes_the_plan_flags_it_recommends_as_fixed_knobs(tmp_path, capsys):
    """"pack the sequences (--packing)": tune takes every knob flag estimate takes, as a fixed value of the space."""
    code, d, _ = small(tmp_path, capsys, "--packing", "--chunked-ce", "--dora", "--attn-impl", "eager",
                       "--method", "lora")
    assert code == 0
    plan = d["best"]["plan"]
    assert (plan["packing"], plan["loss"], plan["dora"], plan["attn_impl"], plan["method"]) == \
        (True, "chunked", True, "eager", "lora")
    assert all(t["plan"].get("packing") for t in d["trials"] if t["plan"])
    code, d, _ = small(tmp_path, capsys, "--loss", "fused-linear", "--checkpoint-layers", "2")
    assert code == 0 and {t["plan"]["loss"] for t in d["trials"] if t["plan"]} == {"fused-linear"}
    assert all(t["plan"]["gradient_checkpointing"] for t in d["trials"] if t["plan"])


@pytest.mark.parametrize("argv,says", [
    (["--packing", "packing=false"], "--packing: contradicts the override packing=..."),
    (["--grad-accum", "4"], "--grad-accum: the search space derives this knob"),
    (["--loss", "plain", "--chunked-ce"], "--chunked-ce: is --loss chunked, which contradicts --loss plain"),
])
def test_plan_flags_that_cannot_hold_are_refused(tmp_path, capsys, argv, says):
    code, _, err = small(tmp_path, capsys, *argv)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_serving_refuses_a_training_knob_flag(capsys):
    code = main(["tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--packing"])
    err = capsys.readouterr().err
    assert code == 2 and "--packing: not supported with --task inference" in err


def test_resuming_counts_the_polish_apart_from_the_planned_trials(tmp_path, capsys):
    """"Resuming: 41 of 40 trials" counted the polish trials among the planned ones."""
    from advisor.cli import build_parser
    from advisor.commands.tune import build_settings
    from advisor.search.select import TrialRecord
    from advisor.search.tuner import POLISH_MARK
    from advisor.ui.render import TuneProgress
    from advisor.ui.tui.state import finished_split

    records = [TrialRecord(number=i, state="complete", plan={}, plan_short="") for i in range(40)]
    records += [TrialRecord(number=40, state="complete", plan={}, plan_short="", ladder=f"{POLISH_MARK} optimizer"),
                TrialRecord(number=41, state="complete", plan={}, plan_short="", duplicate_of=3)]
    assert finished_split(records) == (40, 1)
    settings = build_settings(build_parser().parse_args(
        ["tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "estimate", "--trials", "40",
         "--reports-dir", str(tmp_path)]))
    progress = TuneProgress(settings)
    progress.start(40, 1)
    progress.stop()
    out = capsys.readouterr().out
    assert "Resuming: 40 of 40 planned trials + 1 polish already finished." in out and "41" not in out


@pytest.mark.slow
def test_the_length_nobody_chose_is_said_with_the_answer_at_2k_and_4k(tmp_path, capsys):
    """Issue 41: without seq_len or --data the study plans at the space's 1,024 tokens; the answer says so and gives
    its plan at 2,048 and 4,096 tokens against the same budget. A length the user gives is not second-guessed."""
    base = ["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--gpu", "rtx-4090", "--backend", "estimate",
            "--trials", "8", "--json", "--reports-dir", str(tmp_path)]
    assert main(base) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["seq_len"] == {"tokens": 1024, "chosen": False}
    longer = d["at_common_lengths"]
    assert [a["seq_len"] for a in longer] == [2048, 4096]
    assert longer[0]["run_peak_bytes"] < longer[1]["run_peak_bytes"]
    assert all(a["verdict"] in ("fits", "tight", "over") for a in longer)
    assert main([*base, "seq_len=2048"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["seq_len"] == {"tokens": 2048, "chosen": True} and "at_common_lengths" not in d


def test_the_polish_tries_the_answer_without_an_exact_change_that_buys_nothing():
    """Issue 41: `tune --model llama8b --gpu-budget 24GB --gpu rtx-4090 seq_len=max` answered ZeRO-2 CPU offload,
    which moved 0.10 GiB of LoRA optimizer state for 15.5 GiB of host memory at the same tokens/s; the usual recipe did
    not fit, so the answer had no departures to undo and the plan without offload was never a trial. The answer with
    an exact change undone is tried when it still fits as fast; one the answer needs (its fused loss) is not."""
    from advisor.cli import build_parser
    from advisor.commands.tune import build_settings
    from advisor.core.plan import Plan
    from advisor.search.departures import departures
    from advisor.search.select import TrialRecord
    from advisor.search.tuner import Tuner, predict_change

    settings = build_settings(build_parser().parse_args(
        ["tune", "--model", "llama8b", "--gpu-budget", "24GB", "--gpu", "rtx-4090", "--backend", "estimate",
         "seq_len=29184"]), lookup=False)
    tuner = Tuner(settings)
    answer = Plan(method="qlora", quantization="nf4", double_quant=True, gradient_checkpointing=True,
                  optimizer="adamw_torch", offload="zero2_cpu", grad_accum=8, seq_len=29184, loss="fused-linear",
                  expandable_segments=True)
    recipe = Plan(method="qlora", quantization="nf4", double_quant=True, lora_targets="all-linear",
                  gradient_checkpointing=True, optimizer="adamw_torch_fused", grad_accum=8, seq_len=29184)
    tps, peak = predict_change(settings.model, settings.gpu, 1, settings.sharding, answer)
    best = TrialRecord(number=1, state="complete", plan=answer.to_dict(), plan_short=answer.short(), peak_bytes=peak,
                       tokens_per_s=tps)
    over = TrialRecord(number=0, state="pruned", plan=recipe.to_dict(), plan_short=recipe.short())
    changes = departures(answer, recipe, settings.rules.regime, global_batch=settings.rules.global_batch)
    undone = {d.group for d in tuner._changes_for_nothing(changes, recipe, answer, over, best)}
    assert "CPU offload" in undone and "loss" not in undone


def test_the_answer_is_a_summary_and_every_trial_is_verbose(tmp_path, capsys):
    """Issue 41: a tune printed 340-435 lines (every trial, the Pareto front, the ledger) before its answer. By default:
    the answer, the usual recipe beside it, why, and what to run; --verbose adds the rest."""
    from advisor.cli import main

    argv = ["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--trials", "12",
            "--reports-dir", str(tmp_path)]
    assert main(argv) == 0
    short = capsys.readouterr().out
    assert main([*argv, "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert "Chosen #" in short and "The usual recipe beside the answer" in short and "Run it: add --export DIR" in short
    assert "All trials" not in short and "--verbose" in short
    assert "All trials (" in verbose and "Chosen #" in verbose
    assert len(short.splitlines()) < 80 < len(verbose.splitlines())
    # the per-change lines say they are each measured alone (issue 41: they cannot add up to the answer's gain)
    said = " ".join(short.split())
    assert "Each change below is measured alone, applied to the usual recipe" in said
    assert said.index("measured alone") < said.index("adapters: lora_targets=all-linear -> lora_targets=attention")
