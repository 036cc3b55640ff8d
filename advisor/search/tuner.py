"""The tuner: an Optuna study over a search space, each trial going estimate → simulate → probe.

Storage is any Optuna RDB URL; by default a SQLite file under ``reports/<study>/``. The study is
resumable: re-running the same command continues to the planned number of *finished* trials
(complete or pruned); a trial cut off by Ctrl-C or kill -9 is run again, never counted twice.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from advisor.core.card_rules import card_precision
from advisor.core.errors import AdvisorInputError
from advisor.core.fit import fits, host_fits, host_overshoot, host_usable_bytes, overshoot, usable_bytes
from advisor.core.adapters import attention_linears
from advisor.core.plan import Plan, checkpoint_depth_problems, lora_target_modules
from advisor.memory.sharding import gpu_count_problems, train_gpus  # noqa: F401 (re-exported)
from advisor.memory.closed_form import closed_form_describes, resident_weights_floor
from advisor.runtime.simulate.vision import simulation_gap
from advisor.memory.phases import run_peak_bytes
from advisor.runtime import progress
from advisor.runtime.backends import BackendFailed, get_backend, stages_of
from advisor.runtime.backends._estimate import approximate as approximate_report
from advisor.search.description import ATTR, StudyDescription
from advisor.search.settings import TuneSettings, default_storage, default_study_name  # noqa: F401 (re-exported)
from advisor.search.ladder import ladder
from advisor.search.quality import quality_of, quality_problems
from advisor.search.departures import departures, non_exact, with_change
from advisor.search.recipe import is_recipe, usual_recipe
from advisor.search.select import (ACCURACY_TOLERANCE, POLISH_MARK, TIE, Rules, Selection, TrialRecord,  # noqa: F401
                                   changed_groups, host_peak, is_polish, record_from_trial, run_peak, select,
                                   time_to_quality)
from advisor.search.measured import SIMULATED_ATTR, apply_measured
from advisor.search.prediction import predict_change, shard_to
from advisor.search.space import Conditions, DeadEnd, SearchSpace, model_rules, plan_from_params, point_of
from advisor.search.storage import Heartbeat, is_sqlite, make_storage, study_lock
from advisor.speed.throughput import predict_throughput

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
PRESCREEN_MARGIN = 0.10  # an estimate this far over the budget is pruned without simulating (the ledger is within 5%)
APPROX_MARGIN = 0.10
"""How far the closed form may be off for a plan it does not describe (Gemma-3-1B at 1,024 tokens, a 512-token
window: +2.7% LoRA, +0.8% full fine-tuning with checkpointing, against the simulation): beyond it the approximation
decides; within it the simulation does."""
EXHAUSTED_AFTER = 50  # consecutive repeat proposals after which the space counts as used up
FINISHED = ("COMPLETE", "PRUNED")
POLISH_ROUNDS = 2
"""Rounds of Tuner.polish after the planned trials."""
EDGE_MARGIN = 0.08
"""An estimate-backend answer whose run peak is within this fraction of the usable budget is simulated before it is
given: the closed form's fragmentation and the simulation's allocator replay differed by up to 5% of an 80 GB
budget (a measured recipe: 1.3 against 5.3 GiB), and pre-flight checks the export by simulation."""
NOTHING_GAINED = 0.005
"""A change whose predicted tokens/s gain on the usual recipe is at most this (and that saves no memory) gains
nothing: the polish tries the answer without it."""
def plan_key(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), sort_keys=True)


# ----------------------------------------------------------------------------- events


@dataclass(frozen=True)
class TrialStarted:
    number: int
    plan_short: str


@dataclass(frozen=True)
class TrialFinished:
    record: TrialRecord


# ----------------------------------------------------------------------------- outcomes


@dataclass
class TrialOutcome:
    """What one trial's stages found (``Tuner._evaluate``): a reason when it was pruned, the memory of the stage
    that decided, the predictions, and what a probe measured in their place."""

    plan: Plan
    ladder: str = ""
    stage: str = "plan"
    """The last stage it went through: plan, estimate, simulate or probe."""
    reason: str = ""
    """Why it was pruned ('' when it was not)."""
    invalid: bool = False
    """Pruned before any measurement: not a plan this study may pick."""
    note: str = ""
    memory: dict[str, Any] = field(default_factory=dict)
    """The memory fields of the stage that decided (TrialRecord's peak, ledger, host figures and their source)."""
    prediction: dict[str, Any] = field(default_factory=dict)
    """tokens/s and its source and terms (the step-time model), accuracy loss and token factor (the quality model)."""
    measured: dict[str, Any] = field(default_factory=dict)
    """What a probe measured in place of a prediction (tokens/s, losses, the accuracy of its measured KL)."""
    approximate: bool = False
    """Its memory is the closed form's approximation of a plan it does not describe: a finalist is simulated."""
    closed_form_decides: bool = False
    """A later stage would simulate it, but the closed form, which describes it, puts it clear of both budgets
    (``Tuner._clear_of_the_edge``): it stands as estimated, and simulated once it is the answer."""

    @property
    def pruned(self) -> bool:
        return bool(self.reason)

    def record(self) -> dict[str, Any]:
        """The TrialRecord fields (stored with the trial)."""
        rec: dict[str, Any] = {"plan": self.plan.to_dict(), "plan_short": self.plan.short(), "ladder": self.ladder,
                               "stage": self.stage, **self.memory, **self.prediction, **self.measured}
        if self.reason:
            rec["reason"] = self.reason
        if self.note:
            rec["note"] = self.note
        return rec


_SOURCE_WORD = {"estimate": "estimated", "simulate": "simulated", "probe": "measured"}
_DONE_WORD = {"estimate": "estimated", "simulate": "simulated", "probe": "probed"}


def _undecided(report, settings: "TuneSettings") -> bool:
    """Whether an approximated run peak is within ``APPROX_MARGIN`` of the usable budget (the simulation decides)."""
    limit = usable_bytes(settings.budget.bytes, settings.headroom)
    return limit / (1 + APPROX_MARGIN) < run_peak_bytes(report) <= limit * (1 + APPROX_MARGIN)


def _optimistic(record: TrialRecord) -> TrialRecord:
    """An approximated record with its device peaks ``APPROX_MARGIN`` lower: what it would be if the closed form
    were that much over (a plan that may fit is then a candidate)."""
    if not record.approximate:
        return record
    low = lambda v: int(v / (1 + APPROX_MARGIN)) if v else v  # noqa: E731
    return replace(record, peak_bytes=low(record.peak_bytes), run_peak_bytes=low(record.run_peak_bytes))


# ----------------------------------------------------------------------------- records


class Tuner:
    """Runs (or resumes) one study. Posts TrialStarted / TrialFinished to ``on_event``."""

    def __init__(self, settings: TuneSettings, on_event: Callable[[Any], None] | None = None,
                 first: tuple[tuple[str, dict[str, Any]], ...] = ()):
        self.s = settings
        self.on_event = on_event or (lambda event: None)
        self.first = first
        """(label, point) of plans to run right after the usual recipe (tune seq_len=max: the longest plan)."""
        self.study = None
        self._stop = threading.Event()
        self._pause = threading.Event()

    # -- study ---------------------------------------------------------------

    def open_study(self):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # multivariate TPE over the conditional space (group=True), constraints set per trial
            sampler = optuna.samplers.TPESampler(seed=self.s.seed, multivariate=True, group=True, n_startup_trials=8)
        self.storage = make_storage(self.s.storage, self.s.heartbeat_seconds)  # Optuna's schema, under a lock
        mine = self.s.describe()
        # made and described in one step for every other process: a worker never finds the study without its
        # description, and two tunes started at once cannot both describe it (settings_from_study takes it too)
        with study_lock(self.storage, self.s.storage, self.s.study_name):
            study = optuna.create_study(study_name=self.s.study_name, storage=self.storage, sampler=sampler,
                                        directions=["maximize", "minimize"], load_if_exists=True)
            stored = study.user_attrs.get(ATTR)
            if stored is None:
                study.set_user_attr(ATTR, mine)
        if stored is not None:
            for key in ("space", "backend"):
                if _comparable(stored[key]) != _comparable(mine[key]):
                    raise AdvisorInputError(
                        "--study", f"study {self.s.study_name!r} was made with another {key}; "
                        "name a new study with --study (the existing one is kept as it is)", self.s.study_name)
            if stored["model"]["name"] != mine["model"]["name"] or stored["budget"]["bytes"] != mine["budget"]["bytes"]:
                raise AdvisorInputError("--study", f"study {self.s.study_name!r} is for {stored['model']['name']} at "
                                        f"{stored['budget']['text']}; name a new study with --study", self.s.study_name)
            self._adopt_host_budget(stored)
        self.study = study
        self._recover_interrupted()
        with study_lock(self.storage, self.s.storage, self.s.study_name):
            if not study.user_attrs.get("recipe_enqueued"):
                # the usual recipe first: the baseline the answer is held to (advisor.search.recipe)
                recipe = usual_recipe(self.s.space, card_precision(self.s.card), self._fits_by_estimate)
                named = self.conditions.optuna_params(recipe[1]) if recipe else None
                if named is not None:
                    study.enqueue_trial(named, user_attrs={"ladder": recipe[0]}, skip_if_exists=True)
                study.set_user_attr("recipe_enqueued", True)
                for label, point in self.first:
                    named = self.conditions.optuna_params(point)
                    if named is not None:
                        study.enqueue_trial(named, user_attrs={"ladder": label}, skip_if_exists=True)
            self._enqueue_ladder(study)
        return study

    def _enqueue_ladder(self, study) -> None:
        """The ladder's rungs, as many as the planned --trials leave after the recipe: a rung left waiting would
        run before the polish trials; a rerun with more --trials enqueues the next rungs."""
        done = study.user_attrs.get("ladder_rungs_enqueued", 0)
        room = self.s.trials - 1 - len(self.first)  # the usual recipe and the first plans come before
        if study.user_attrs.get("ladder_enqueued") or done >= room:
            return
        # a rung the rules (or this model's modules, or the GPU count) do not allow is left out before the room is
        # counted
        rungs = [(rung, named) for rung, params in ladder(self.s.space, self._fits_by_estimate)
                 if (named := self.conditions.optuna_params(params)) is not None]
        for rung, named in rungs[done:room]:
            study.enqueue_trial(named, user_attrs={"ladder": rung}, skip_if_exists=True)
        study.set_user_attr("ladder_rungs_enqueued", min(room, len(rungs)))
        study.set_user_attr("ladder_enqueued", room >= len(rungs))

    def _adopt_host_budget(self, stored: dict[str, Any]) -> None:
        """A study goes on with the host budget it was made for: a detected one yields to it (the study may be
        resumed on another machine), and a study made before host budgets keeps its host memory unchecked; a
        --host-budget that differs from the stored one is an error."""
        hb = stored.get("host_budget")
        if self.s.host_detected or self.s.host_budget is None:
            d = StudyDescription.from_dict(stored)
            self.s = replace(self.s, host_budget=d.host_budget, host_detected=d.host_detected)  # settings are frozen
        elif hb is not None and int(hb["bytes"]) != self.s.host_budget.bytes:
            raise AdvisorInputError("--host-budget", f"study {self.s.study_name!r} was made for a host budget of "
                                    f"{hb['text']}; name a new study with --study", self.s.host_budget.text)

    def _recover_interrupted(self) -> None:
        """Trials left RUNNING (kill -9) or FAILED by an interruption are failed and enqueued again, once.

        Only for a single-process SQLite study; with a shared RDB, Optuna's heartbeat does this.
        """
        from optuna.trial import TrialState

        if not is_sqlite(self.s.storage):
            return
        retried = set(self.study.user_attrs.get("retried", []))
        finished_keys = {t.user_attrs.get("plan_key") for t in self.study.get_trials(deepcopy=False)
                         if t.state.name in FINISHED}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.FAIL)):
            if t.number in retried:
                continue
            if t.state == TrialState.RUNNING:
                self.study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            if t.params and t.user_attrs.get("plan_key") not in finished_keys:
                self.study.enqueue_trial(t.params, user_attrs={k: v for k, v in t.user_attrs.items()
                                                               if k == "ladder"})
            retried.add(t.number)
        self.study.set_user_attr("retried", sorted(retried))

    def finished_count(self) -> int:
        """Finished trials that evaluated a plan of their own (a repeat proposal is answered from the
        first and does not count: it cost nothing)."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.state.name in FINISHED and "duplicate_of" not in t.user_attrs)

    def _exhausted(self, trials) -> bool:
        """The sampler keeps proposing plans already evaluated: the space is (nearly) used up."""
        done = sorted((t for t in trials if t.state.name in FINISHED), key=lambda t: t.number)
        tail = done[-EXHAUSTED_AFTER:]
        return len(tail) == EXHAUSTED_AFTER and all("duplicate_of" in t.user_attrs for t in tail)

    # -- running -------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def pause(self, paused: bool) -> None:
        (self._pause.set if paused else self._pause.clear)()

    @property
    def paused(self) -> bool:
        return self._pause.is_set()

    def run(self) -> None:
        """Run trials until the study holds ``trials`` finished ones (this worker and others together)."""
        if self.study is None:
            self.open_study()
        while not self._stop.is_set():
            if self._pause.is_set():
                time.sleep(0.1)
                continue
            trial = self._ask()
            if trial is WAIT:
                time.sleep(self.s.heartbeat_seconds)
                continue
            if trial is None:
                self.simulate_finalists()  # the approximated plans that could be the answer (none: nothing to do)
                return
            self._run_trial(trial)

    def polish(self) -> None:
        """After the planned trials: the answer with each of its non-exact changes from the usual recipe undone,
        evaluated as trials of their own, so that a change that buys no more than the step-time model's error
        gives way to the simpler plan (advisor.search.select.simplest). ``POLISH_ROUNDS`` rounds at most; the
        trials it adds are counted in the study (attribute "polish_trials"), so a resumed study keeps them."""
        for _ in range(POLISH_ROUNDS):
            if self._stop.is_set():
                return
            with study_lock(self.storage, self.s.storage, self.s.study_name):
                proposed = self._propose_simpler()
                if proposed:
                    self.study.set_user_attr("polish_trials", self.study.user_attrs.get("polish_trials", 0) + proposed)
            if not proposed:
                return
            self.run()

    def _propose_simpler(self) -> int:
        """Enqueue the answer with each non-exact change undone (one at a time), and each exact change that gains
        nothing (``_changes_for_nothing``); the number enqueued."""
        sel = self.selection()
        best, recipe = sel.best, sel.recipe
        if best is None or recipe is None or best.number == recipe.number:
            return 0
        recipe_plan, plan = Plan.from_dict(recipe.plan), Plan.from_dict(best.plan)
        seq = self.s.space.fixed["seq_len"]  # a plan sized to --data holds its longest batch: the space's point
        tried = [t.system_attrs.get("fixed_params", t.params) for t in self.study.get_trials(deepcopy=False)]
        n = 0
        changes = sel.departures
        if changes:
            changes = [*non_exact(changes), *self._changes_for_nothing(changes, recipe_plan, plan, recipe, best)]
        else:  # the usual recipe does not fit: the answer's exact changes from its plan that buy nothing all the same
            rules = self.s.rules
            changes = self._changes_for_nothing(departures(plan, recipe_plan, rules.regime,
                                                           global_batch=rules.global_batch, gpus=rules.gpus),
                                                recipe_plan, plan,
                                                recipe, best)
        for d in changes:
            variant = with_change(plan, recipe_plan, d)  # the answer with the recipe's values of this group
            point = point_of(variant.with_(seq_len=seq), self.s.space, self.s.model.arch or {}) if variant else None
            named = self.conditions.optuna_params(point) if point is not None else None
            if named is not None and named not in tried:  # a rerun of a finished study proposes nothing new
                self.study.enqueue_trial(named,
                                         user_attrs={"ladder": f"{POLISH_MARK} {d.group} as in the usual recipe"})
                tried.append(named)
                n += 1
        return n

    def _changes_for_nothing(self, changes, recipe_plan: Plan, plan: Plan, recipe, best=None) -> list:
        """The exact changes from the usual recipe that buy nothing, by the step-time model and the closed form (as
        the explanation's per-change lines say): applied to the recipe alone, one that gains no speed (under half a
        percent of its predicted tokens/s) and saves no memory; or, undone from the answer (``best``), one whose
        answer without it still fits the budget (and the host's) at the answer's speed (ZeRO-2 CPU offload that
        moved 0.10 GiB of LoRA optimizer state for 15.5 GiB of host memory, issue 41). The answer with each undone
        is tried, so that such a change gives way to the recipe's value."""
        out = []
        for d in changes:
            if d.kind != "exact":
                continue
            variant = with_change(recipe_plan, plan, d) if recipe.tokens_per_s else None
            if variant is not None:
                tps, peak = self._measure_change(variant)
                recipe_peak = run_peak(recipe)
                if tps and tps <= recipe.tokens_per_s * (1 + NOTHING_GAINED) and peak is not None and recipe_peak \
                        and peak >= recipe_peak:
                    out.append(d)
                    continue
            if self._fits_without(d, recipe_plan, plan, best):
                out.append(d)
        return out

    def _fits_without(self, change, recipe_plan: Plan, plan: Plan, best) -> bool:
        """Does the answer with ``change`` undone (the recipe's values of its group) still fit the budget, and the
        host's, as fast as the answer (within NOTHING_GAINED), by the closed form and the step-time model?"""
        without = with_change(plan, recipe_plan, change)
        if without is None or best is None or not best.tokens_per_s:
            return False
        point = point_of(without.with_(seq_len=self.s.space.fixed["seq_len"]), self.s.space, self.s.model.arch or {})
        if point is None or not self._fits_by_estimate(point):
            return False
        tps, _ = self._measure_change(without)
        return bool(tps) and tps >= best.tokens_per_s * (1 - NOTHING_GAINED)

    def _ask(self):
        """A new trial, unless finished + running trials already reach the plan (checked under the study lock); WAIT
        while other workers' running trials are all that is left (in a shared storage): each ends, or its worker
        died and it goes stale, is failed here and retried (a worker that left then would leave it running)."""
        from optuna.storages import fail_stale_trials
        from optuna.trial import TrialState

        with study_lock(self.storage, self.s.storage, self.s.study_name):
            if not is_sqlite(self.s.storage):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # experimental API; "heartbeat is meant for optimize()"
                    fail_stale_trials(self.study)  # dead workers' trials: failed and enqueued again
            trials = self.study.get_trials(deepcopy=False)
            busy = sum(1 for t in trials if t.state == TrialState.RUNNING
                       or (t.state.name in FINISHED and "duplicate_of" not in t.user_attrs))
            planned = self.s.trials + self.study.user_attrs.get("polish_trials", 0)
            if self._exhausted(trials):
                return None
            if busy >= planned:
                running = sum(1 for t in trials if t.state == TrialState.RUNNING)
                return WAIT if running and not is_sqlite(self.s.storage) and busy - running < planned else None
            with warnings.catch_warnings():
                # heartbeats are recorded by advisor.search.storage.Heartbeat
                warnings.simplefilter("ignore", UserWarning)
                trial = self.study.ask()
            trial.set_user_attr("worker", WORKER_ID)
            return trial

    def wait_until_finished(self, poll_seconds: float = 1.0) -> None:
        """For a process that only watches: post the trials other workers finish until the plan is reached."""
        seen: set[int] = set()
        while not self._stop.is_set():
            for t in self.study.get_trials(deepcopy=False):
                if t.state.name in FINISHED and t.number not in seen:
                    seen.add(t.number)
                    self.on_event(TrialFinished(record_from_trial(t)))
            if self.finished_count() >= self.s.trials:
                return
            time.sleep(poll_seconds)

    def _run_trial(self, trial) -> None:
        import optuna
        from optuna.trial import TrialState

        try:
            with Heartbeat(self.storage, trial._trial_id):
                values = self._objective(trial)
        except optuna.TrialPruned:
            self.study.tell(trial, state=TrialState.PRUNED)
        except BaseException:
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        else:
            self.study.tell(trial, values=list(values))

    def records(self) -> list[TrialRecord]:
        """Every trial's record, the finalists' measured quality laid over them (advisor.search.measured)."""
        return apply_measured([record_from_trial(t) for t in self.study.get_trials(deepcopy=False)],
                              self.study.user_attrs)

    def selection(self, records: list[TrialRecord] | None = None) -> Selection:
        """The selection over the study's records (or over ``records``: the finalists ask it again without the
        ones already taken, advisor.search.finalists)."""
        return select(self.records() if records is None else records, self.s.budget.bytes, self.s.headroom,
                      self.s.tolerance, self.s.budget.unit, self.s.rules, measure_change=self._measure_change)

    def _measure_change(self, plan: Plan) -> tuple[float | None, int | None]:
        return predict_change(self.s.model, self.s.gpu, train_gpus(self.s.gpus, plan), self.s.sharding, plan,
                              data=self.s.data)


    # -- one trial -----------------------------------------------------------

    @property
    def conditions(self) -> Conditions:
        """The space's knobs under the plan rules and this model's modules (one per tuner: it memoizes)."""
        if getattr(self, "_conditions", None) is None:
            rules, settings, gpus = model_rules(self.s.model, self.s.card), self.s.rules, self.s.gpus

            def check(plan: Plan):  # the model's and card's rules, the GPU count's, then quality evidence
                return (rules(plan) or gpu_count_problems(plan, gpus)
                        or quality_problems(plan, settings.regime, global_batch=settings.global_batch,
                                            gpus=settings.gpus))

            self._conditions = Conditions(self.s.space, self.s.model.arch or {}, check)
        return self._conditions

    def _suggest(self, trial) -> dict[str, Any]:
        """A point of the space, define-by-run: each knob asked only where it applies, with the values
        the plan rules allow after the knobs before it (so every proposal is a valid plan)."""
        return self.conditions.walk(lambda name, knob, offered: trial.suggest_categorical(name, offered))

    def _objective(self, trial):
        start = time.perf_counter()
        try:
            params = self._suggest(trial)
        except DeadEnd as e:  # a safety net: the lookahead of Conditions keeps the shipped spaces out of it
            rec = {"plan": {}, "plan_short": "", "ladder": trial.user_attrs.get("ladder", ""), "stage": "plan",
                   "reason": f"invalid: no value of {e.knob} is allowed after the knobs chosen"}
            return self._finish(trial, rec, pruned=True, invalid=True)
        plan = _sized(self.s, plan_from_params(params, self.s.space, self.s.model.arch or {}))
        key = plan_key(plan)
        trial.set_user_attr("plan_key", key)
        self.on_event(TrialStarted(trial.number, plan.short()))
        previous = self._finished_with(key, trial.number)
        if previous is not None:
            trial.set_user_attr("duplicate_of", previous.number)
            rec = dict(previous.user_attrs["record"], reason=previous.user_attrs["record"].get("reason", ""))
            rec["ladder"] = trial.user_attrs.get("ladder", "")
            rec["seconds"] = 0.0
            rec["reason"] = (rec["reason"] + f" (same plan as #{previous.number})").strip()
            rec["duplicate_of"] = previous.number
            return self._finish(trial, rec, pruned=previous.state.name == "PRUNED", values=previous.values)
        outcome = self._evaluate(plan, trial.user_attrs.get("ladder", ""))
        rec = outcome.record()
        rec["seconds"] = time.perf_counter() - start
        if outcome.reason:
            return self._finish(trial, rec, pruned=True, invalid=outcome.invalid)
        # the sampler's objectives: tokens/s per token factor (1 / time to quality), and the accuracy loss
        return self._finish(trial, rec, pruned=False,
                            values=(rec["tokens_per_s"] / rec.get("token_factor", 1.0), rec["accuracy_loss"]))

    def _finish(self, trial, rec: dict[str, Any], pruned: bool, values=None, invalid: bool = False):
        import optuna

        peak = rec.get("run_peak_bytes") or rec.get("peak_bytes")  # the run's peak decides
        # constraint for the sampler: > 0 when the peak (with headroom) exceeds the budget
        trial.set_constraint("memory", 1.0 if invalid or peak is None
                             else overshoot(peak, self.s.budget.bytes, self.s.headroom))
        # and > 0 when the host peak exceeds the host budget less the OS reserve (advisor.core.fit.host_fits)
        trial.set_constraint("host_memory", 1.0 if invalid else host_overshoot(rec.get("host_peak_bytes") or 0,
                                                                               self.s.host_budget_bytes))
        trial.set_user_attr("record", rec)
        state = "pruned" if pruned else "complete"
        self.on_event(TrialFinished(TrialRecord(number=trial.number, state=state, **rec)))
        if pruned:
            raise optuna.TrialPruned(rec.get("reason", ""))
        return tuple(values)

    def _finished_with(self, key: str, number: int):
        for t in self.study.get_trials(deepcopy=False):
            if t.number != number and t.state.name in FINISHED and t.user_attrs.get("plan_key") == key \
                    and "record" in t.user_attrs and "duplicate_of" not in t.user_attrs:
                return t
        return None

    def _incumbent(self) -> TrialRecord | None:
        """The answer so far (simulated or measured trials only); None outside a study."""
        if self.study is None:
            return None
        records = [r for r in self.records() if r.source != "estimated" or r.closed_form_decides]
        return select(records, self.s.budget.bytes, self.s.headroom, self.s.tolerance, rules=self.s.rules).best

    def _cannot_win(self, plan: Plan, ttq: float) -> str:
        """Why a plan whose predicted time to quality is ``ttq`` cannot become the answer ('' when it could):
        it is slower than the answer so far beyond a tie, or it changes non-exact levers of the usual recipe
        for a gain within the step-time model's error (advisor.search.select)."""
        incumbent, recipe = self._incumbent(), self._recipe_baseline()
        need = self.s.rules.needed_gain()
        changes = non_exact(departures(plan, Plan.from_dict(recipe.plan), self.s.regime,
                                       global_batch=self.s.rules.global_batch, gpus=self.s.gpus)) \
            if recipe is not None else []
        if incumbent is not None and ttq > time_to_quality(incumbent) * (1 + TIE):
            simpler = recipe is not None and changed_groups(changes) < changed_groups(departures(
                Plan.from_dict(incumbent.plan), Plan.from_dict(recipe.plan), self.s.regime,
                global_batch=self.s.rules.global_batch, gpus=self.s.gpus))
            if not (simpler and ttq <= time_to_quality(incumbent) * (1 + need)):  # a simpler plan may still win
                return (f"its predicted time to quality is {ttq / time_to_quality(incumbent) - 1:+.0%} behind "
                        f"#{incumbent.number}")
        if recipe is not None:
            gain = time_to_quality(recipe) / ttq - 1
            if changes and gain <= need:
                return (f"it changes {', '.join(d.group for d in changes)} of the usual recipe (#{recipe.number}) "
                        f"for a predicted {gain:+.0%} in time to quality, within the step-time model's "
                        f"{self.s.rules.needed_gain():.0%} median error")
        return ""

    def _recipe_baseline(self) -> TrialRecord | None:
        """The usual recipe's trial once it has run and fits (simulated or measured), else None."""
        if self.study is None:
            return None
        for r in self.records():
            if is_recipe(r.ladder) and r.duplicate_of is None:
                ok = (r.state == "complete" and (r.source != "estimated" or r.closed_form_decides) and r.tokens_per_s
                      and fits(run_peak(r), self.s.budget.bytes, self.s.headroom)
                      and host_fits(host_peak(r), self.s.host_budget_bytes))
                return r if ok else None
        return None

    def _fits_without_dynamics(self) -> TrialRecord | None:
        """A finished trial that fits the budget without levers that change training dynamics, if any."""
        if self.study is None:
            return None
        for r in self.records():
            if r.state == "complete" and r.duplicate_of is None and run_peak(r) is not None \
                    and fits(run_peak(r), self.s.budget.bytes, self.s.headroom) \
                    and host_fits(host_peak(r), self.s.host_budget_bytes) \
                    and not quality_of(Plan.from_dict(r.plan), self.s.regime).dynamics:
                return r
        return None

    def _per_gpu(self, report, plan: Plan):
        """The ledger of one GPU of the target run (sharded when it has several), with the run's phases:
        decisions are on the run's peak (load, train, eval, generate, save), not the step's."""
        from advisor.runtime.phases import with_phases

        return with_phases(self.s.model, plan, self.s.gpu, _shard(self.s, report, plan))

    def _fits_by_estimate(self, params: dict[str, Any]) -> bool:
        """Whether the point fits by the estimate (the usual recipe and the ladder's rungs are chosen by it). A plan
        the closed form does not describe is decided by its approximation where that is more than
        ``APPROX_MARGIN`` from the budget, else by the simulation."""
        s = self.s
        plan = _sized(s, plan_from_params(params, s.space, s.model.arch or {}))
        if plan.problems():
            return False
        try:
            if closed_form_describes(s.model, plan)[0]:
                rep = self._per_gpu(get_backend("estimate").measure(s.model, plan, s.gpu), plan)
            else:
                if _weights_over_budget(s, plan):
                    return False
                rep = self._per_gpu(approximate_report(s.model, plan, s.gpu), plan)
                if _undecided(rep, s):
                    with progress.working(f"simulating {plan.short()}: its approximation is within "
                                          f"{APPROX_MARGIN:.0%} of the budget"):
                        rep = self._per_gpu(get_backend("simulate").measure(s.model, plan, s.gpu), plan)
        except AdvisorInputError:
            return False
        return fits(run_peak_bytes(rep), s.budget.bytes, s.headroom) \
            and host_fits(_host_peak(s, rep), s.host_budget_bytes)

    def _invalid(self, plan: Plan, quality) -> str:
        """Why ``plan`` is not a plan this study may pick ('' when it is): its rules, this model's modules and
        depth, quality evidence, and levers that change training dynamics where something else fits."""
        s = self.s
        problems = plan.problems() or gpu_count_problems(plan, s.gpus)
        if problems:
            return f"invalid: {problems[0].rule}"
        try:
            lora_target_modules(plan, list(s.model.linear_shapes()), attention_linears(s.model))
        except AdvisorInputError as e:
            return f"invalid: {e.rule}"
        for e in checkpoint_depth_problems(plan, s.model.num_layers):
            return f"invalid: {e.rule}"
        if not quality.pickable:
            return f"no quality evidence: {quality.uncovered[0]}"
        if quality.dynamics:
            steady = self._fits_without_dynamics()
            if steady is not None:  # levers that change training dynamics only where nothing else fits
                return (f"changes training dynamics ({', '.join(quality.dynamics)}): searched only where nothing "
                        f"else fits, and #{steady.number} fits without it")
        return ""

    @property
    def stages(self):
        """The stages this study's backend declares (advisor.runtime.backends: each backend class's ``stages``)."""
        return stages_of(self.s.backend)

    def _evaluate(self, plan: Plan, rung: str) -> "TrialOutcome":
        """The stages the backend declares, in order (estimate → simulate → probe for a cuda probe); the typed
        outcome, with a reason when pruned."""
        s = self.s
        out = TrialOutcome(plan=plan, ladder=rung)
        quality = quality_of(plan, s.regime, global_batch=s.space.fixed.get("global_batch"), gpus=s.gpus)
        out.reason = self._invalid(plan, quality)
        if out.reason:
            out.invalid = True
            return out
        stages = self.stages
        report, prediction = None, {}
        for i, stage in enumerate(stages):
            out.stage = stage.name
            if stage.name == "estimate":
                report = self._estimate_stage(out, plan, stage, stages[i + 1:])
                if out.reason or report is None:
                    return out
                tps = predict_throughput(s.model, plan, s.gpu, train_gpus(s.gpus, plan), s.sharding, data=s.data)
                prediction = dict(tokens_per_s=tps.tokens_per_s, tokens_per_s_source=tps.source, step_terms=tps.terms,
                                  accuracy_loss=quality.accuracy_loss, accuracy_source=quality.accuracy_source,
                                  token_factor=quality.token_factor)
                if out.approximate:  # the finalists are simulated (simulate_finalists); the others stop here
                    out.prediction = prediction
                    return out
                continue
            if stage.finalists_only:
                why_not = self._cannot_win(plan, quality.token_factor / prediction["tokens_per_s"])
                if why_not:
                    # cannot become the answer: the stage before (within a few % of this one) decides, and the
                    # seconds of this stage go to plans that could win
                    out.stage = stages[i - 1].name
                    out.prediction = prediction
                    out.reason = self._over(report, _SOURCE_WORD[stages[i - 1].name])
                    if not out.reason:
                        out.note = f"not {_DONE_WORD[stage.name]}: {why_not}"
                    return out
                if stage.name == "simulate" and stages[i - 1].name == "estimate":
                    clear = self._clear_of_the_edge(report, plan)
                    if clear:  # the closed form decides: the simulation could not move it across the budget
                        out.stage, out.prediction, out.note = "estimate", prediction, f"not simulated: {clear}"
                        out.closed_form_decides = out.memory["closed_form_decides"] = True
                        return out
            if stage.name == "simulate":
                report = self._per_gpu(get_backend(stage.backend).measure(s.model, plan, s.gpu), plan)
                out.memory = _memory_fields(report, s.gpus)
                out.reason = self._over(report, "simulated") if stage.decides else ""
                if out.reason:
                    return out
            elif stage.name == "probe":
                out.prediction = prediction
                report = self._probe_stage(out, plan, stage, quality)
                if out.reason:
                    return out
        out.prediction = out.prediction or prediction
        return out

    def _clear_of_the_edge(self, report, plan: Plan) -> str:
        """Why the simulation cannot change what the closed form says of a plan it describes ('' when it might):
        its run peak and its host peak are both more than ``EDGE_MARGIN`` under what the budgets leave usable.
        The closed form is held within 3% of the simulation on every layer kind it describes
        (tests/test_analytic_vs_simulate.py, tests/test_simulate_moe.py), its host count of an activation offload
        with them (tests/test_host_offload_copies.py), and their allocator fragmentation within
        5% of the budget, so a plan that far under both budgets fits by either."""
        s = self.s
        if not closed_form_describes(s.model, plan)[0]:
            return ""
        gap = simulation_gap(s.model, plan)
        if gap:
            return f"{gap}; the closed form, which describes it, decides"
        limit = usable_bytes(s.budget.bytes, s.headroom) * (1 - EDGE_MARGIN)
        if run_peak_bytes(report) > limit:
            return ""
        host = s.host_budget_bytes
        if host is not None and _host_peak(s, report) > host_usable_bytes(host) * (1 - EDGE_MARGIN):
            return ""
        under = 1 - run_peak_bytes(report) / usable_bytes(s.budget.bytes, s.headroom)
        return (f"the closed form, which describes it, puts its run peak {under:.0%} under the usable budget "
                f"(more than the {EDGE_MARGIN:.0%} where it and the simulation can disagree); the answer is "
                f"simulated")

    def _estimate_stage(self, out: "TrialOutcome", plan: Plan, stage, later) -> Any:
        """The closed form: the report, or None with ``out.reason`` when the plan is screened out. A plan it does
        not describe is approximated by it (``approximate_report``), never simulated here: with no later stage that
        simulates every plan, the trial ends approximate and the finalists are simulated (``simulate_finalists``);
        with one, the approximation screens within its margin."""
        s = self.s
        fmt = s.budget.format
        floor = _weights_over_budget(s, plan)
        if floor:  # what the weights already decide, without the approximation
            out.reason = floor
            return None
        describes = closed_form_describes(s.model, plan)[0]
        if describes:
            report = self._per_gpu(get_backend(stage.backend).measure(s.model, plan, s.gpu), plan)
        else:
            report = self._per_gpu(approximate_report(s.model, plan, s.gpu), plan)
        out.memory = _memory_fields(report, s.gpus)
        deferred = not describes and all(st.finalists_only for st in later)
        if deferred:
            out.reason = self._over(report, "estimated", margin=APPROX_MARGIN, of_limit=True)
            if out.reason:
                return None
            out.approximate = out.memory["approximate"] = True
            out.note = (f"memory approximated by the closed form ({closed_form_describes(s.model, plan)[1]}): "
                        f"a finalist is simulated")
            return report
        if stage.decides and not later:
            out.reason = self._over(report, "estimated", margin=0.0)
            return None if out.reason else report
        peak = run_peak_bytes(report)
        if describes and any(st.name == "simulate" for st in later) and not any(st.name == "probe" for st in later):
            # the simulation decides what the closed form, which describes the plan, puts within EDGE_MARGIN of the
            # budgets; beyond it above, as beyond it below (_clear_of_the_edge), the closed form decides
            limit = usable_bytes(s.budget.bytes, s.headroom)
            if peak > limit * (1 + EDGE_MARGIN):
                out.reason = (f"estimated peak {fmt(peak)}{_during(report)} over the budget {fmt(s.budget.bytes)}: "
                              f"{peak / limit - 1:.0%} over what it leaves usable, beyond the {EDGE_MARGIN:.0%} where "
                              f"the closed form (which describes it) and the simulation can disagree")
                return None
            host = s.host_budget_bytes
            if host is not None and _host_peak(s, report) > host_usable_bytes(host) * (1 + EDGE_MARGIN):
                out.reason = _over_host(s, report, "estimated")
                return None
        margin = PRESCREEN_MARGIN if describes else (1 + PRESCREEN_MARGIN) * (1 + APPROX_MARGIN) - 1
        if peak > s.budget.bytes * (1 + margin):
            out.reason = f"estimated peak {fmt(peak)}{_during(report)} over the budget {fmt(s.budget.bytes)}"
            return None
        out.reason = _over_host(s, report, "estimated", margin)
        return None if out.reason else report

    def _probe_stage(self, out: "TrialOutcome", plan: Plan, stage, quality) -> Any:
        """A real run of the plan (cpu or cuda): what it measured replaces the predictions."""
        s = self.s
        options = s.probe_options
        if stage.on_target_gpu and options.budget_bytes is None:
            # the budget enforced for real: torch.cuda.set_per_process_memory_fraction in the child
            options = replace(options, budget_bytes=s.budget.bytes)
        try:
            report = self._per_gpu(get_backend(stage.backend).measure(s.model, plan, s.gpu, options), plan)
        except BackendFailed as e:
            out.reason = f"probe {e.status}: {e.message}"[:300]
            return None
        out.memory = _memory_fields(report, s.gpus)
        measured = report.measured
        if measured is not None and measured.tokens_per_s:
            out.measured.update(tokens_per_s=float(measured.tokens_per_s) * s.gpus, tokens_per_s_source="measured")
            if stage.on_target_gpu and options.num_layers is None:  # a part-depth probe is not the plan's speed
                _calibrate_speed(s, plan, float(measured.tokens_per_s))
        if measured is not None and measured.losses:
            out.measured["losses"] = [float(x) for x in measured.losses]
        if measured is not None and measured.fidelity_kl is not None:  # the measured KL replaces the format's prior
            q = quality_of(plan, s.regime, global_batch=s.space.fixed.get("global_batch"),
                           measured_kl=float(measured.fidelity_kl), gpus=s.gpus)
            out.measured.update(accuracy_loss=q.accuracy_loss, accuracy_source=q.accuracy_source)
        if stage.decides:
            out.reason = self._over(report, "measured", host=False)
        return report

    def _over(self, report, source: str, *, margin: float | None = None, of_limit: bool = False,
              host: bool = True) -> str:
        """Why ``report``'s run peak does not fit ('' when it does): with the headroom (advisor.core.fit), or, with
        ``margin``, only when over the usable budget by more than that margin; then its host peak."""
        s = self.s
        fmt = s.budget.format
        peak = run_peak_bytes(report)
        if margin is None:
            if not fits(peak, s.budget.bytes, s.headroom):
                return (f"{source} peak {fmt(peak)}{_during(report)} leaves less than {s.headroom:.0%} of "
                        f"{fmt(s.budget.bytes)}")
        elif peak > usable_bytes(s.budget.bytes, s.headroom) * (1 + margin):
            return (f"{source} peak {fmt(peak)}{_during(report)} over the budget {fmt(s.budget.bytes)} less headroom"
                    + (f" by more than the {margin:.0%} the approximation may be off" if of_limit else ""))
        return _over_host(s, report, source, margin or 0.0) if host else ""

    # -- the finalists ---------------------------------------------------------

    def simulate_finalists(self) -> int:
        """Simulate the trials whose memory the closed form only approximates (a plan it does not describe), or,
        when no stage of the backend simulates, estimates within ``EDGE_MARGIN`` of the usable budget, that could
        be the answer (pre-flight checks the export by simulation, so an answer at the edge is simulated first): the
        selection's answer and usual recipe, both as the records say and with every
        approximation ``APPROX_MARGIN`` lower (a plan that may fit), until all four are simulated. What the
        simulation finds is stored with the study (advisor.search.measured.SIMULATED_ATTR) and laid over the trial's
        record by every reader, so the answer is the one simulating every trial gives. The number simulated."""
        if self.study is None:
            return 0
        n = 0
        while not self._stop.is_set():
            records = self.records()
            todo: dict[int, TrialRecord] = {}
            done = self.study.user_attrs.get(SIMULATED_ATTR) or {}
            for sel in (self.selection(records), self.selection([_optimistic(r) for r in records])):
                for r in (sel.best, sel.recipe):
                    if r is not None and (r.approximate or self._estimated_at_the_edge(r)
                                          or (r is sel.best and r.closed_form_decides)) \
                            and not simulation_gap(self.s.model, Plan.from_dict(r.plan)):
                        number = r.duplicate_of if r.duplicate_of is not None else r.number
                        if str(number) not in done:  # each trial once, whatever its record says after
                            todo.setdefault(number, r)
            if not todo:
                return n
            for number, r in sorted(todo.items()):
                n += 1
                plan = Plan.from_dict(r.plan)
                with progress.working(f"simulating finalist {n}: #{number} {r.plan_short}"):
                    report = self._per_gpu(get_backend("simulate").measure(self.s.model, plan, self.s.gpu), plan)
                fields = _memory_fields(report, self.s.gpus)
                fields["reason"] = self._over(report, "simulated")
                with study_lock(self.storage, self.s.storage, self.s.study_name):
                    stored = dict(self.study.user_attrs.get(SIMULATED_ATTR) or {})
                    stored[str(number)] = fields
                    self.study.set_user_attr(SIMULATED_ATTR, stored)
        return n


    def _estimated_at_the_edge(self, r: TrialRecord) -> bool:
        """An answer the closed form alone decided (no stage of the backend simulates), whose run peak is within
        ``EDGE_MARGIN`` of the usable budget, where the estimate's and the simulation's allocator fragmentation
        can disagree by a few percent."""
        if r.state != "complete" or r.source != "estimated" or not run_peak(r):
            return False
        if any(st.name in ("simulate", "probe") for st in self.stages):
            return False
        return run_peak(r) > usable_bytes(self.s.budget.bytes, self.s.headroom) * (1 - EDGE_MARGIN)


WAIT = object()
"""What ``Tuner._ask`` answers while other workers' trials are all that is left to run."""


def _calibrate_speed(settings: TuneSettings, plan: Plan, tokens_per_s: float) -> None:
    """Measured beats predicted: a real probe also refits this GPU model's step-time scales
    (advisor/speed/calibration.py), so later predictions on it say "calibrated (N probes)"."""
    from advisor.core.catalog import detect_gpu
    from advisor.speed.calibration import record_probe

    try:
        record_probe(settings.model, plan, detect_gpu() or settings.gpu, tokens_per_s)
    except (OSError, ValueError):
        pass  # a read-only cache or an odd rate never stops the study


def _shard(settings: TuneSettings, report, plan: Plan):
    return shard_to(report, settings.model, plan, train_gpus(settings.gpus, plan), settings.sharding, settings.gpu)


def _during(report) -> str:
    phase = report.run_peak_phase
    return "" if phase == "train" else f" during {phase}"


def _host_peak(settings: TuneSettings, report) -> int:
    """The host peak of the machine: each of the --gpus ranks on it is a process of its own."""
    return int(report.host_peak_bytes) * settings.gpus


def _over_host(settings: TuneSettings, report, source: str, margin: float = 0.0) -> str:
    """Why a plan is over the host budget (advisor.core.fit.host_fits), naming its host peak, its pinned and
    pageable bytes and the budget; "" when it fits (or is within ``margin`` of it, before a later stage)."""
    budget = settings.host_budget_bytes
    peak = _host_peak(settings, report)
    if budget is None or host_fits(peak / (1 + margin), budget):
        return ""
    fmt = settings.budget.format
    g = settings.gpus
    phase = report.host_memory.peak_phase if report.host_memory is not None else "train"
    return (f"{source} host peak {fmt(peak)}{' during load' if phase == 'load' else ''} (pinned "
            f"{fmt(report.host_pinned_bytes * g)}, pageable {fmt(report.host_pageable_bytes * g)}) over the host "
            f"budget {fmt(budget)} less the OS reserve ({fmt(host_usable_bytes(budget))} usable)")


def _memory_fields(report, gpus: int = 1) -> dict[str, Any]:
    # peak_bytes is the step's (its ledger sums to it); run_peak_bytes, the highest phase, is what feasibility
    # is decided on (advisor.search.select.run_peak)
    fields = {"peak_bytes": int(report.peak_bytes), "run_peak_bytes": report.run_peak_bytes,
              "run_peak_phase": report.run_peak_phase,
              "tensor_peak_bytes": int(report.tensor_peak_bytes),
              "source": report.source, "ledger": {k: int(v) for k, v in report.device.items()}}
    if report.host_memory is not None:
        # a probe measures no host memory: the simulated figures stay
        fields.update(host_bytes=int(report.host_bytes), host_peak_bytes=int(report.host_peak_bytes) * gpus,
                      host_peak_phase=report.host_memory.peak_phase,
                      host_pinned_bytes=int(report.host_pinned_bytes) * gpus,
                      host_pageable_bytes=int(report.host_pageable_bytes) * gpus,
                      host_ledger={k: int(v) for k, v in report.host.items() if v}, host_source=report.source)
    return fields


def _comparable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if k not in ("source", "overrides", "trials")}
    return value


def _sized(settings: TuneSettings, plan: Plan) -> Plan:
    """With --data, the plan at the sequence length its peak is set by (the longest batch unless packed)."""
    return settings.data.sized(plan, settings.model) if settings.data is not None else plan


def _weights_over_budget(settings: TuneSettings, plan: Plan) -> str:
    """Why ``plan`` cannot fit when its resident weights alone exceed the budget ("" otherwise), decided without
    the simulation the estimate runs for a plan the closed form cannot answer (advisor.memory.closed_form)."""
    if settings.gpus > 1 or closed_form_describes(settings.model, plan)[0]:
        return ""
    floor = resident_weights_floor(settings.model, plan)
    if floor is None or floor <= settings.budget.bytes:
        return ""
    fmt = settings.budget.format
    return f"weights alone {fmt(floor)} (estimated) over the budget {fmt(settings.budget.bytes)}"


def smallest_plan_report(settings: TuneSettings):
    """(plan, report, host note): the most frugal plan of the space and its estimated peak (to fail fast under tiny
    budgets); a plan over the host budget is left out, the first one named in the note. Plans whose
    weights alone are over the budget are not measured (advisor.memory.closed_form.resident_weights_floor); a plan
    the closed form does not describe is approximated by it (``approximate_report``), and simulated only where the
    smallest approximation is within ``APPROX_MARGIN`` of the budget (the answer then hangs on it)."""
    space = settings.space
    plans = [plan_from_params(params, space, settings.model.arch or {}) for params in _frugal_candidates(space)]
    plans.sort(key=lambda p: not closed_form_describes(settings.model, p)[0])  # the closed form's answers first
    found, host_over = [], []
    for plan in plans:
        refused = plan.problems() or gpu_count_problems(plan, settings.gpus)
        if refused or (found and _weights_over_budget(settings, plan)):
            continue
        describes = closed_form_describes(settings.model, plan)[0]
        try:
            rep = (get_backend("estimate").measure(settings.model, plan, settings.gpu) if describes
                   else approximate_report(settings.model, plan, settings.gpu))
        except AdvisorInputError:
            continue
        sharded = _shard(settings, rep, plan)
        over_host = _over_host(settings, sharded, "its") if sharded.peak_bytes <= settings.budget.bytes else ""
        if over_host:  # within the GPU budget but not the host's (an offload's): no way under it, said beside it
            host_over.append((plan, over_host))
            continue
        found.append((sharded.peak_bytes, not describes, plan, sharded))
    host_note = (f"{host_over[0][0].short()} would fit the GPU, but {host_over[0][1]}: give --host-budget for the "
                 "machine the run is for") if host_over else ""
    if not found:
        return None
    found.sort(key=lambda f: f[0])
    budget = settings.budget.bytes
    if not found[0][1] or not (budget / (1 + APPROX_MARGIN) < found[0][0] <= budget * (1 + APPROX_MARGIN)):
        return found[0][2], found[0][3], host_note
    # the smallest is an approximation near the budget: the simulation decides, smallest approximation first
    band = [f for f in found if f[1] and f[0] <= budget * (1 + APPROX_MARGIN)]
    best = None
    for i, (_, _, plan, _) in enumerate(band, 1):
        with progress.working(f"simulating plan {i}/{len(band)}: {plan.short()} (is the smallest plan within "
                              f"the budget?)"):
            try:
                rep = _shard(settings, get_backend("simulate").measure(settings.model, plan, settings.gpu), plan)
            except AdvisorInputError:
                continue
        if best is None or rep.peak_bytes < best[1].peak_bytes:
            best = (plan, rep)
        if rep.peak_bytes <= budget:
            break
    return (*(best or (found[0][2], found[0][3])), host_note)


def _frugal_candidates(space: SearchSpace):
    """Each method, quantization, offload and optimizer of the space, every other knob at the value its
    declaration calls the most frugal (Search.frugal; none declared: the Plan's default)."""
    from advisor.search.space import search_knobs

    s = space.search
    ks = search_knobs(space.plan)
    frugal = {k.name: k.search.frugal(s[k.name]) for k in ks.values() if k.search.frugal is not None and k.name in s}
    workload = space.workload  # what the knobs' applies read beside the point (a GRPO lever: the task)
    for method in space.methods():
        for quant in space.quantizations_for(method):
            for offload in s["offload"]:
                for opt in s["optimizer"]:
                    point = {**frugal, "method": method, "quantization": quant, "optimizer": opt, "offload": offload}
                    # a frugal value where its knob does not apply (double quantization of int8 weights) is left out
                    yield {k: v for k, v in point.items() if k not in frugal or ks[k].applies_to({**workload, **point})}


def settings_from_study(storage_url: str, study_name: str, backend: str | None = None,
                        heartbeat_seconds: int = 10) -> TuneSettings:
    """The settings a study was created with (its description), for a worker that joins it."""
    import optuna

    storage = make_storage(storage_url, heartbeat_seconds)
    try:
        with study_lock(storage, storage_url, study_name):  # not between its creation and its description
            study = optuna.load_study(study_name=study_name, storage=storage)
            d = study.user_attrs.get(ATTR)
    except KeyError:
        raise AdvisorInputError("--study", "no such study in this storage (create it with advisor tune --storage ...)",
                                study_name) from None
    if not d:
        raise AdvisorInputError("--study", "this study was not made by advisor tune", study_name)
    return TuneSettings.from_description(StudyDescription.from_dict(d), storage=storage_url, study_name=study_name,
                                         backend=backend, heartbeat_seconds=heartbeat_seconds)
