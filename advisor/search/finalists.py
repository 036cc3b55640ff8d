"""Measured quality where it can be measured: the study's finalists each train a short run, and the loss they
reach after the same number of tokens replaces the quality prior (advisor.search.measured stores it).

When: the backend runs real probes (cuda; cpu for tests and small models) and `advisor tune` has real weights
(``--weights``) and text (``--data``). ``why_not_measured`` says why not otherwise; the output says the
quality is from priors then.

**The finalists**: the selection's answer and the ones after it in the selection's own ranking (select() run
again without the ones already taken), ``FINALISTS`` in all, plus the usual-recipe trial when the study has one
(a trial whose ladder rung names the recipe). Each trains from the same weights on the same documents in the
same order with the same seed, for the same training tokens: a plan with fewer tokens per optimizer step takes
more steps (``training_tokens``). It trains at the constant learning rate an export of the plan starts from
(quality.yaml ``hyperparameters``: AdamW 2e-4 for adapters, 2e-5 for full fine-tuning; a dynamics optimizer's
own), in a probe child process (advisor.runtime.probe), under the budget on a GPU. No 16-bit reference model is
loaded beside it (the probe's fidelity pass): where QLoRA is the answer, the 16-bit base would not fit.

**The loss compared**, L: cross-entropy per token on documents of --data held out from training (a fixed,
content-hashed ~10%), after the run, in the same windows for every finalist. Not the mean training loss of the
last k steps: that averages different batches for plans of different step sizes, carries the batches' own
spread (the data's, not the plan's), and is measured while those very batches are being fitted. Measured on the
tiny test model (tests/test_measured_quality.py, LoRA r16, 60 steps, another seed and document order): the
held-out loss moved 0.006 nats, the mean training loss of the last 5 steps 0.065.

**The noise**: the reference runs once more with another seed and another document order; |L2 - L1| estimates
the noise of a difference of two L (two runs, each with its own noise). It is stored beside the measured
figures (``NOISE_RUNS``; 0 skips it).

**The reference** the differences are taken against: the usual recipe when it is a finalist that ran; else the
finalist with the lowest accuracy loss before the measurement (the closest to quality.yaml's zero point), the
lowest L among equals. advisor.search.measured gives the formula.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.search.measured import ATTR, FinalistRun, QualityMeasurement, stored_measurement

FINALISTS = 3
"""The selection's answer and the next ones in its ranking that train a run (plus the usual recipe)."""
STEPS = 30
"""Default length of a run: this many optimizer steps of the finalist with the most tokens per step."""
HELD_OUT_FRACTION = 0.1
"""Share of --data's documents held out (at least one; never fewer than one left to train on)."""
EVAL_TOKENS = 8192
"""Held-out tokens L is computed over at most (in windows of ``EVAL_WINDOW``: one forward each, no backward)."""
EVAL_WINDOW = 512
"""Longest evaluation window, tokens (the probe's own default)."""
LCM_SLACK = 4
"""Largest common multiple of the finalists' steps accepted, in targets (``training_tokens``)."""
NOISE_RUNS = 1
"""Extra runs of the reference with another seed and document order (0: no noise estimate)."""
RECIPE_MARK = "recipe"
"""A trial whose ladder rung contains this word is the usual recipe (advisor.search.ladder)."""
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")


# ------------------------------------------------------------------------------------------- when it runs


def check_weights(path: str) -> str:
    """``--weights``: a directory holding weight files; the path, resolved. An input error otherwise."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise AdvisorInputError("--weights", "no such directory", path)
    if not any(next(p.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise AdvisorInputError("--weights", f"no weight files ({', '.join(WEIGHT_FILES)}) in the directory", path)
    return str(p.resolve())


def check_data(path: str) -> None:
    """``--data`` for the quality runs: documents to train on and at least one to hold out. An input error
    otherwise, before the study starts rather than after it."""
    from advisor.runtime.probe import read_documents

    split_documents(read_documents(path))


def why_not_measured(backend: str, weights: str | None, data: Any) -> str:
    """Why the finalists' quality is not measured ("" when it is): a backend without real runs, or no weights
    or no text to train on."""
    if backend not in ("cpu", "cuda"):
        return f"the {backend} backend trains nothing (measured quality needs --backend cuda, or cpu for small models)"
    if not weights and data is None:
        return "no --weights and no --data to train the finalists on"
    if not weights:
        return "no --weights (real weights of the model) to train the finalists from"
    if data is None:
        return "no --data (your documents) to train the finalists on"
    if getattr(data, "how", "") == "given":
        return "--data lists token lengths: no text to train on"
    return ""


# ------------------------------------------------------------------------------------------- the finalists


def canonical(record: Any, records: Iterable[Any]) -> Any:
    """The trial that evaluated the record's plan (a repeat proposal points to it)."""
    if record.duplicate_of is None:
        return record
    return next((r for r in records if r.number == record.duplicate_of), record)


def usual_recipe(records: list[Any], feasible: Callable[[Any], bool]) -> Any | None:
    """The usual-recipe trial when the study has one that finished and fits (its rung names the recipe)."""
    for r in records:
        if RECIPE_MARK in (r.ladder or "").lower() or getattr(r, "recipe", False):
            r = canonical(r, records)
            if r.state == "complete" and feasible(r):
                return r
    return None


def choose_finalists(records: list[Any], best_of: Callable[[list[Any]], Any | None], feasible: Callable[[Any], bool],
                     k: int = FINALISTS) -> tuple[list[Any], Any | None]:
    """(the finalists, the usual-recipe trial or None): the selection's answer, then the next best by the same
    selection over what is left, ``k`` in all; the recipe added when it is not among them."""
    chosen: list[Any] = []
    left = list(records)
    while len(chosen) < k:
        best = best_of(left)
        if best is None:
            break
        chosen.append(best)
        left = [r for r in left if r.number != best.number]
    recipe = usual_recipe(records, feasible)
    if recipe is not None and all(r.number != recipe.number for r in chosen):
        chosen.append(recipe)
    return chosen, recipe


def training_tokens(plans: list[Plan], steps: int = STEPS, tokens: int | None = None) -> int:
    """Training tokens every finalist runs: ``tokens`` (default ``steps`` steps of the largest step) rounded
    up to a whole number of steps of every plan (their tokens per step's least common multiple), unless that
    multiple is over ``LCM_SLACK`` times the target (sequence lengths with no common measure): then the target,
    each plan running the whole steps that reach it (``steps_for``: within one step of it)."""
    per_step = [p.tokens_per_step for p in plans]
    target = tokens or steps * max(per_step)
    common = math.lcm(*per_step)
    if common > LCM_SLACK * target:
        return target
    return common * max(1, -(-target // common))


def steps_for(plan: Plan, tokens: int) -> int:
    """Optimizer steps of ``plan`` that reach ``tokens`` (exactly when its step divides them)."""
    return max(1, -(-tokens // plan.tokens_per_step))


def learning_rate(plan: Plan) -> float:
    """The constant rate the plan's run trains at: the one its dynamics optimizer's source used, else AdamW's
    for the method (quality.yaml ``hyperparameters``; the exports start from the same)."""
    from advisor.search.quality import quality_data, recommended_hyperparameters

    hp = recommended_hyperparameters(plan)
    if isinstance(hp.get("learning_rate"), (int, float)):
        return float(hp["learning_rate"])
    return float(quality_data().hyperparameters["reference"]["learning_rate"]["peft" if plan.peft else "full"])


# ----------------------------------------------------------------------------------------------- the data


def split_documents(docs: list[str], fraction: float = HELD_OUT_FRACTION) -> tuple[list[str], list[str]]:
    """(train, held out): the documents whose SHA-256 sorts first are held out (a fixed choice, independent of
    the file's order), the rest trained on in file order. A single document is split at its blank lines."""
    if len(docs) == 1:
        docs = [d for d in docs[0].split("\n\n") if d.strip()]
    if len(docs) < 2:
        raise AdvisorInputError("--data", "needs at least 2 documents (JSONL lines, or paragraphs of a text file) "
                                "to hold one out for the quality measurement", len(docs), show_value=False)
    n_held = min(len(docs) - 1, max(1, round(len(docs) * fraction)))
    order = sorted(range(len(docs)), key=lambda i: hashlib.sha256(docs[i].encode("utf-8")).hexdigest())
    held = set(order[:n_held])
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def write_jsonl(docs: list[str], path: Path) -> str:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return str(path)


def data_key(path: str) -> dict[str, Any]:
    p = Path(path)
    st = p.stat()
    return {"path": str(p.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


# ----------------------------------------------------------------------------------------------- the runs


def train_finalist(model: Any, plan: Plan, number: int, *, device: str, weights: str, train_file: str,
                   held_out_file: str, tokens: int, seed: int, eval_window: int, budget_bytes: int | None,
                   timeout: float, eval_tokens: int = EVAL_TOKENS) -> tuple[FinalistRun, int]:
    """One finalist's run: ``tokens`` training tokens from ``weights`` on ``train_file``, then L on the held-out
    documents; and the held-out tokens L was computed over."""
    from advisor.runtime.probe import run_probe

    steps = steps_for(plan, tokens)
    lr = learning_rate(plan)
    r = run_probe(model, plan, device=device, steps=steps, warmup=0, timeout=timeout, data=train_file,
                  memory_limit_bytes=budget_bytes, weights_dir=weights, eval_texts=[held_out_file],
                  max_eval_tokens=eval_tokens, seed=seed, learning_rate=lr, eval_window=eval_window, fidelity=False)
    return FinalistRun(number=number, plan_short=plan.short(), status=r.status, message=r.message, seed=seed,
                       steps=r.steps_done, tokens=r.steps_done * plan.tokens_per_step, learning_rate=lr,
                       held_out_loss=r.eval_loss_after, held_out_loss_before=r.eval_loss_base,
                       train_losses=tuple(r.losses), wall_s=r.wall_s), r.fidelity_tokens


def pick_reference(runs: list[FinalistRun], priors: dict[int, float], recipe: Any | None) -> tuple[int | None, str]:
    """The run the others are measured against, and why (module docstring)."""
    ok = [r for r in runs if r.ok]
    if not ok:
        return None, ""
    if recipe is not None and any(r.number == recipe.number for r in ok):
        return recipe.number, "the usual recipe"
    ref = min(ok, key=lambda r: (round(priors.get(r.number, 0.0), 6), r.held_out_loss))
    return ref.number, "the finalist with the lowest prior"


def measure_finalists(model: Any, finalists: list[Any], recipe: Any | None, *, device: str, weights: str,
                      data: str, seed: int = 0, steps: int = STEPS, tokens: int | None = None,
                      budget_bytes: int | None = None, noise_runs: int = NOISE_RUNS, eval_tokens: int = EVAL_TOKENS,
                      on_progress: Callable[[str], None] | None = None) -> QualityMeasurement:
    """Train every finalist (TrialRecords) for the same tokens and measure L (module docstring)."""
    from advisor.runtime.probe import read_documents

    say = on_progress or (lambda line: None)
    plans = [Plan.from_dict(r.plan) for r in finalists]
    total = training_tokens(plans, steps, tokens)
    window = min(EVAL_WINDOW, *(p.seq_len for p in plans))
    train_docs, held_docs = split_documents(read_documents(data))
    priors = {r.number: float(r.accuracy_loss or 0.0) for r in finalists}
    work = Path(tempfile.mkdtemp(prefix="advisor-finalists-"))
    try:
        train_file = write_jsonl(train_docs, work / "train.jsonl")
        held_file = write_jsonl(held_docs, work / "held_out.jsonl")
        runs: list[FinalistRun] = []
        held_tokens = 0
        for i, (rec, plan) in enumerate(zip(finalists, plans), 1):
            say(f"quality run {i}/{len(plans)}: #{rec.number} {plan.short()}, {total:,} tokens "
                f"({steps_for(plan, total)} steps)")
            run, counted = train_finalist(model, plan, rec.number, device=device, weights=weights,
                                          train_file=train_file, held_out_file=held_file, tokens=total, seed=seed,
                                          eval_window=window, budget_bytes=budget_bytes, timeout=_timeout(rec, total),
                                          eval_tokens=eval_tokens)
            runs.append(run)
            held_tokens = max(held_tokens, counted)
        reference, why = pick_reference(runs, priors, recipe)
        noise = noise_run = None
        if reference is not None and noise_runs > 0:
            rec = next(r for r in finalists if r.number == reference)
            plan = Plan.from_dict(rec.plan)
            shuffled = list(train_docs)
            random.Random(seed + 1).shuffle(shuffled)
            say(f"quality noise run: #{reference} again with seed {seed + 1} and another document order")
            noise_run, _ = train_finalist(model, plan, reference, device=device, weights=weights,
                                          train_file=write_jsonl(shuffled, work / "train_shuffled.jsonl"),
                                          held_out_file=held_file, tokens=total, seed=seed + 1, eval_window=window,
                                          budget_bytes=budget_bytes, timeout=_timeout(rec, total),
                                          eval_tokens=eval_tokens)
            first = next(r for r in runs if r.number == reference)
            if noise_run.ok:
                noise = abs(noise_run.held_out_loss - first.held_out_loss)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    anchor = priors.get(reference, 0.0) if reference is not None else 0.0
    return QualityMeasurement(tokens=total, held_out_tokens=held_tokens, held_out_documents=len(held_docs),
                              train_documents=len(train_docs), eval_window=window, reference=reference,
                              reference_why=why, reference_accuracy=anchor, runs=tuple(runs), noise=noise,
                              noise_run=noise_run, priors=priors, weights=weights, data=data, device=device)


def _timeout(record: Any, tokens: int) -> float:
    """Seconds a run may take: loading and the two held-out passes, plus 5x the training time at the speed the study
    saw for the plan."""
    tps = record.tokens_per_s or 0.0
    return 600.0 + (5 * tokens / tps if tps > 0 else 3600.0)


# ----------------------------------------------------------------------------------------------- the study


def run_finalists(tuner: Any, *, steps: int = STEPS, tokens: int | None = None, noise_runs: int = NOISE_RUNS,
                  on_progress: Callable[[str], None] | None = None) -> QualityMeasurement | None:
    """After ``tuner.run()``: measure the finalists' quality and store it with the study (``ATTR``); reuse the
    stored measurement when the finalists, tokens, weights, data and seed are the same. When quality cannot be
    measured here (``why_not_measured``), the study's earlier measurement if it has one, else None."""
    from advisor.core.fit import fits
    from advisor.search.select import run_peak
    from advisor.search.select import record_from_trial

    s = tuner.s
    stored = stored_measurement(tuner.study.user_attrs)
    if why_not_measured(s.backend, s.weights, s.data):
        return stored
    raw = [record_from_trial(t) for t in tuner.study.get_trials(deepcopy=False)]  # priors, not a measurement

    def feasible(r: Any) -> bool:
        return r.peak_bytes is not None and fits(run_peak(r), s.budget.bytes, s.headroom)

    finalists, recipe = choose_finalists(raw, lambda records: tuner.selection(records).best, feasible)
    if not finalists:
        return stored
    plans = [Plan.from_dict(r.plan) for r in finalists]
    key = {"finalists": [r.number for r in finalists], "tokens": training_tokens(plans, steps, tokens),
           "weights": s.weights, "data": data_key(s.data.source), "seed": s.seed, "device": s.backend,
           "noise_runs": noise_runs}
    if stored is not None and stored.key == key:
        return stored
    m = measure_finalists(s.model, finalists, recipe, device=s.backend, weights=s.weights, data=s.data.source,
                          seed=s.seed, steps=steps, tokens=tokens,
                          budget_bytes=s.budget.bytes if s.backend == "cuda" else None, noise_runs=noise_runs,
                          on_progress=on_progress)
    m = replace(m, key=key)
    tuner.study.set_user_attr(ATTR, m.to_dict())
    return m


__all__ = ["FINALISTS", "NOISE_RUNS", "STEPS", "check_data", "check_weights", "choose_finalists", "learning_rate",
           "measure_finalists", "run_finalists", "split_documents", "steps_for", "training_tokens", "usual_recipe",
           "why_not_measured"]
