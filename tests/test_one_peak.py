"""Issue 41, item 5: one plan, one peak. A GRPO answer's peak is the run's (its highest phase) in the summary, the
trial table, the phases, the report and the export's header, and `advisor preflight` on that export, run from the
shell the header says (its allocator setting: TRL's file has no field for it), gives the same number."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main

TUNE = ["tune", "--task", "grpo", "--model", "qwen7b", "--gpu-budget", "24GB", "--gpu", "rtx-4090", "--backend",
        "estimate", "--trials", "5", "expandable_segments=true"]


@pytest.fixture(scope="module")
def answer(tmp_path_factory):
    out = tmp_path_factory.mktemp("one-peak")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*TUNE, "--reports-dir", str(out / "r"), "--export", str(out / "out"), "--json"])
    assert code == 0
    return json.loads(buf.getvalue()), out


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


@pytest.mark.slow  # a GRPO tune (estimate backend, 5 trials) shared by the module: 6 s
def test_the_phases_the_summary_and_the_export_header_give_one_peak(answer):
    d, out = answer
    best, rl = d["best"], d["rl"]
    peak = best["run_peak_bytes"]
    assert peak >= best["peak_bytes"] and best["plan"]["expandable_segments"] is True
    assert rl["run_peak_bytes"] == peak and rl["run_peak_phase"] == best["run_peak_phase"]
    assert max(p["peak_bytes"] for p in rl["phases"].values()) == peak
    header = (out / "out" / "trl.yaml").read_text()
    assert f"# peak memory (estimated): {_gib(peak)}" in header
    # the allocator setting has no TRL field: the header says to check from a shell that sets it
    assert "# Check: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True advisor preflight " in header


@pytest.mark.slow
def test_preflight_from_the_shell_the_header_names_gives_the_same_peak(answer, capsys, monkeypatch):
    d, out = answer
    args = ["preflight", str(out / "out" / "trl.yaml"), "--gpu", "rtx-4090", "--gpu-budget", "24GB", "--backend",
            "estimate", "--json"]

    def checked() -> tuple[int, dict]:
        main(args)
        found = {f["check"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
        return found["memory.fit"]["data"]["peak_bytes"], found

    without, found = checked()
    assert "env.allocator" not in found
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    peak, found = checked()
    assert peak == d["best"]["run_peak_bytes"] != without  # the setting moves the peak: read, not ignored
    assert "read from this shell" in found["env.allocator"]["title"]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:yes")
    assert main(args) == 2 and "PYTORCH_CUDA_ALLOC_CONF expandable_segments" in capsys.readouterr().err


def test_the_trial_table_and_the_report_give_the_runs_peak():
    from advisor.search.select import TrialRecord
    from advisor.ui.render import gpu_peak_text, step_and_run_rows

    fmt = lambda n: _gib(n)  # noqa: E731
    r = TrialRecord(number=3, state="complete", plan={}, plan_short="p", peak_bytes=11 * 2**30,
                    run_peak_bytes=14 * 2**30, run_peak_phase="sync", source="simulated")
    assert gpu_peak_text(r, fmt) == "14.00 GiB during sync"
    assert step_and_run_rows(r, fmt) == [("Peak of the training step", "11.00 GiB"),
                                         ("Peak on the GPU (the run's, during sync)", "14.00 GiB")]
    step = TrialRecord(number=4, state="complete", plan={}, plan_short="p", peak_bytes=11 * 2**30,
                       run_peak_bytes=11 * 2**30, run_peak_phase="train", source="simulated")
    assert gpu_peak_text(step, fmt) == "11.00 GiB" and step_and_run_rows(step, fmt) == [("Peak on the GPU",
                                                                                          "11.00 GiB")]


@pytest.mark.slow
def test_a_grpo_answer_at_longer_sequences_lengthens_its_completions(answer):
    """GRPO sizes by prompt + completion (its seq_len is unused): the answer at 2K and 4K tokens has longer
    completions, so it needs more than the answer itself (the closed form's seq_len did not move it)."""
    d, _ = answer
    assert d["seq_len"] == {"tokens": 1024, "chosen": False}  # 512 + 512, the space's
    longer = d["at_common_lengths"]
    assert [a["seq_len"] for a in longer] == [2048, 4096]
    assert d["best"]["run_peak_bytes"] < longer[0]["run_peak_bytes"] < longer[1]["run_peak_bytes"]


def test_a_simulated_answers_phases_and_lengths_come_from_the_simulation(monkeypatch):
    """The phases and the longer lengths of an answer whose peak was simulated are simulated too (the closed form's
    gave a second peak beside the answer's: 13.45 GiB against 14.08 GiB for the 24 GB GRPO answer)."""
    from types import SimpleNamespace

    import advisor.search.lengths as lengths
    import advisor.search.rl_answer as rl_answer
    from advisor.commands.tune import length_fields, rl_of
    from advisor.core.plan import Plan
    from advisor.search.select import TrialRecord
    from advisor.search.space import load_space

    asked = []
    monkeypatch.setattr(rl_answer, "rl_answer", lambda *a: asked.append(("phases", a[-1])))
    monkeypatch.setattr(lengths, "at_common_lengths", lambda s, p, backend: asked.append(("lengths", backend)) or [])
    plan = Plan(task="grpo", method="lora").to_dict()
    settings = SimpleNamespace(model=None, gpu=None, gpus=1, sharding=None, space=load_space("grpo"), data=None)
    for source, backend in (("simulated", "simulate"), ("estimated", "estimate")):
        best = TrialRecord(number=0, state="complete", plan=plan, plan_short="p", peak_bytes=1, source=source)
        rl_of(settings, best)
        length_fields(settings, best, searched=False)
        assert asked[-2:] == [("phases", backend), ("lengths", backend)]
