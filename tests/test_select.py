"""Selection over plain records: feasibility with headroom, the tolerance, ties, the Pareto front."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from advisor.search.select import TrialRecord, fits, pareto_front, select

GiB = 2**30


def rec(n, tps, peak_gib, acc=0.01, state="complete", method="lora", reason=""):
    return TrialRecord(number=n, state=state, plan={"method": method}, plan_short=f"plan{n}",
                       peak_bytes=int(peak_gib * GiB),
                       tokens_per_s=tps, accuracy_loss=acc, source="simulated", tokens_per_s_source="predicted",
                       accuracy_source="prior", reason=reason)


def test_fits_with_headroom():
    assert fits(22.7 * GiB, 24 * GiB, 0.05) and not fits(22.9 * GiB, 24 * GiB, 0.05)


def test_highest_throughput_within_tolerance_and_budget():
    records = [rec(0, 900, 20), rec(1, 1200, 23.5), rec(2, 1100, 18, acc=0.2), rec(3, 1000, 15),
               rec(4, 5000, 80, state="pruned", method="full", reason="estimated peak over")]
    s = select(records, 24 * GiB, 0.05, 0.05)
    assert s.best.number == 3  # #1 lacks headroom, #2 loses too much accuracy
    assert s.runner_up.number == 0
    text = " ".join(s.explanation)
    assert "#3" in text and "Full fine-tuning rejected" in text and "#2" in text


def test_ties_go_to_more_headroom():
    s = select([rec(0, 1000, 20), rec(1, 1010, 15)], 24 * GiB, 0.05, 0.05)
    assert s.best.number == 1


def test_ties_go_to_the_more_accurate_plan_before_more_headroom():
    """Equal throughput: an fp4 plan with room to spare loses to an nf4 one that also fits (priors 0.035 vs
    0.015); losses within the quality model's resolution (0.01 nats/token) still go to more headroom, and CPU
    offload stays the last resort."""
    from dataclasses import replace

    fp4, nf4 = rec(0, 1000, 15, acc=0.035), rec(1, 1005, 18, acc=0.015)
    assert select([fp4, nf4], 24 * GiB, 0.05, 0.05).best.number == 1
    close = rec(2, 1010, 16, acc=0.017)
    assert select([fp4, nf4, close], 24 * GiB, 0.05, 0.05).best.number == 2
    offload = replace(rec(3, 1000, 10, acc=0.0), plan={"method": "lora", "offload": "zero2_cpu"})
    assert select([nf4, offload], 24 * GiB, 0.05, 0.05).best.number == 1


def test_nothing_fits():
    s = select([rec(0, 1000, 30)], 24 * GiB, 0.05, 0.05)
    assert s.best is None and "No plan fits" in s.explanation[0]


def test_pareto_front_drops_dominated():
    a, b, c = rec(0, 1000, 20, acc=0.01), rec(1, 900, 21, acc=0.02), rec(2, 800, 10, acc=0.01)
    front = pareto_front([a, b, c])
    assert {t.number for t in front} == {0, 2}


def test_explanation_names_the_deciding_step_time_terms():
    from dataclasses import replace

    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.core.plan import Plan
    from advisor.speed.throughput import predict_throughput

    model, gpu = resolve_model("qwen2.5-7b-instruct"), resolve_gpu("a100-80gb")
    fast_plan = Plan(method="lora", micro_batch=4, seq_len=1024)
    slow_plan = fast_plan.with_(gradient_checkpointing=True)  # the same plan paying for recomputation
    records = []
    for n, plan in enumerate((fast_plan, slow_plan)):
        tp = predict_throughput(model, plan, gpu)
        records.append(replace(rec(n, tp.tokens_per_s, 20), plan=plan.to_dict(), plan_short=plan.short(),
                               step_terms=tp.terms))
    sel = select(records, 80 * 2**30, 0.05, 0.1)
    assert sel.best.number == 0 and sel.runner_up.number == 1
    decided = next(line for line in sel.explanation if line.startswith("Decided by"))
    assert "recomputation +" in decided  # the term checkpointing adds is what separates them
    # a tie (within 2%) says so: the terms differ, headroom decided
    tie = [replace(records[0], tokens_per_s=1000.0), replace(records[1], tokens_per_s=990.0, peak_bytes=10 * GiB)]
    line = next(x for x in select(tie, 80 * GiB, 0.05, 0.1).explanation if x.startswith("Time-to-quality tie"))
    assert "recomputation" in line and "more headroom decided" in line
    less_accurate = [tie[0], replace(tie[1], accuracy_loss=0.05)]
    line = next(x for x in select(less_accurate, 80 * GiB, 0.05, 0.1).explanation
                if x.startswith("Time-to-quality tie"))
    assert line.endswith("the lower accuracy loss decided.")
    assert any(line.startswith("Its predicted step") and "matmuls" in line for line in sel.explanation)
    # records without terms (older studies) explain as before
    plain = [replace(r, step_terms={}) for r in records]
    assert not any(line.startswith(("Decided by", "Throughput tie", "Its predicted"))
                   for line in select(plain, 80 * 2**30, 0.05, 0.1).explanation)


def test_one_pareto_rule_for_training_and_serving():
    """non_dominated is what both the training selection and the serving one keep (larger is better)."""
    from advisor.search.select import non_dominated

    points = {"a": (3, 1), "b": (1, 3), "c": (1, 1), "d": (3, 1), "e": (2, 2)}
    assert non_dominated(points, lambda k: points[k]) == ["a", "b", "d", "e"]  # equal points do not dominate
    from advisor.search import serve_select

    assert serve_select.non_dominated is non_dominated


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)), max_size=40))
def test_the_front_is_the_definitions_in_the_items_order(keys):
    """non_dominated sweeps in descending order against the front found so far (a grid of 10^5 plans in seconds);
    it keeps exactly the items no other item dominates, in their own order, duplicates included."""
    from advisor.search.select import non_dominated

    def dominated(k):
        return any(all(x >= y for x, y in zip(o, k)) and o != k for o in keys)

    items = list(range(len(keys)))
    assert non_dominated(items, keys.__getitem__) == [i for i in items if not dominated(keys[i])]


def test_a_full_answer_is_not_said_to_reject_full_fine_tuning_and_the_runner_up_compares_run_peaks():
    """Issue 42: "Full fine-tuning rejected: #29" beside a full fine-tune answer; the runner-up's memory difference came
    from the training steps' peaks, not the runs' the summaries give."""
    from advisor.search.select import TrialRecord, select

    def rec(n, state, method, peak, run_peak, tps, reason=""):
        return TrialRecord(number=n, state=state, plan={"method": method, "micro_batch": 1}, plan_short=f"{method}{n}",
                           peak_bytes=peak, run_peak_bytes=run_peak, run_peak_phase="sync" if run_peak != peak
                           else "train", tokens_per_s=tps, source="estimated", accuracy_loss=0.0, reason=reason)

    gib = 2**30
    records = [rec(0, "complete", "full", 10 * gib, 10 * gib, 100.0),
               rec(1, "complete", "full", 8 * gib, 13 * gib, 90.0),
               rec(2, "pruned", "full", 90 * gib, 90 * gib, 0.0, "estimated peak over the budget")]
    sel = select(records, 24 * gib, 0.05, 0.05)
    assert sel.best.number == 0
    assert not any(line.startswith("Full fine-tuning rejected") for line in sel.explanation)
    runner = next(line for line in sel.explanation if line.startswith("Runner-up"))
    assert "+3.00 GiB memory" in runner  # 13 GiB run against 10 GiB (the steps: -2 GiB)
