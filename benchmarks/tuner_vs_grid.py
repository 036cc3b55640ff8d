"""Does the tuner find the exhaustive grid's best plan, and with how many evaluations?

    python benchmarks/tuner_vs_grid.py [--backend estimate|simulate] [--max-trials 400] [--markdown]

For each (model, budget, space) the whole grid is evaluated with the tuner's own evaluator (the
same estimate → simulate chain, no Optuna), the grid's best is selected with the same rule, and
then a fresh Optuna study runs trial by trial until its selection reaches the grid's best
throughput (within the 2% the selection itself treats as a tie). Evaluations are trials that
evaluated a plan of their own (repeat proposals cost nothing). The goal (issue 5): at most 25%
of the grid's evaluations.
"""

from __future__ import annotations

from dataclasses import replace

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# after the sys.path insertion above: the script runs from a checkout without the package installed
from advisor.core.catalog import gpu_for_budget, resolve_model  # noqa: E402
from advisor.search.select import TIE, TrialRecord, select  # noqa: E402
from advisor.search.space import load_space, plan_from_params  # noqa: E402
from advisor.search.tuner import Tuner, TuneSettings  # noqa: E402
from advisor.core.units import parse_budget  # noqa: E402

CASES = {
    "estimate": [("qwen7b", "24GB", "default", ()), ("qwen7b", "16GB", "qlora", ()), ("llama8b", "48GB", "default", ()),
                 ("qwen14b", "24GB", "low-memory", ()), ("qwen3-8b", "80GB", "throughput", ()),
                 ("mistral7b", "24GB", "default", ())],
    # simulation costs seconds a point: a small model and a reduced space keep the grid affordable (128 plans:
    # the fused-linear loss and expandable segments, added to the qlora space since, are left out)
    "simulate": [("qwen0.5b", "6GB", "qlora", ("lora_r=[16,64]", "optimizer=[paged_adamw_8bit,adamw_torch]",
                                               "quantization=[nf4]", "lora_targets=[attention]",
                                               "loss=[plain,chunked]", "expandable_segments=[false]"))],
}


def settings_for(model: str, budget: str, space: str, overrides, backend: str, folder: Path, trials: int):
    spec = resolve_model(model)
    b = parse_budget(budget)
    sp = load_space(space, list(overrides))
    name = f"bench-{model}-{budget}-{space}-{backend}"
    return TuneSettings(model=spec, space=sp, budget=b, gpu=gpu_for_budget(b.bytes), gpu_assumed=True,
                        backend=backend, storage=f"sqlite:///{folder / (name + '.db')}", study_name=name,
                        trials=trials)


def grid_best(settings: TuneSettings):
    from rich.console import Console
    from rich.progress import track

    tuner = Tuner(settings)
    records, seen = [], set()
    points = list(settings.space.grid())
    for params in track(points, description=f"grid of {len(points):,} points", transient=True,
                        console=Console(stderr=True)):
        plan = plan_from_params(params, settings.space, settings.model.arch or {})
        if plan.problems() or plan.short() in seen:
            continue
        seen.add(plan.short())
        outcome = tuner._evaluate(plan, "")
        state = "pruned" if outcome.pruned else "complete"
        records.append(TrialRecord(number=len(records), state=state, **outcome.record()))
    sel = select(records, settings.budget.bytes, settings.headroom, settings.tolerance, settings.budget.unit)
    return sel.best, len(records)


def trials_to_reach(settings: TuneSettings, target_tps: float) -> tuple[int | None, float]:
    """Evaluations (trials that evaluated a plan of their own) until the tuner's pick is as fast as the grid's."""
    tuner = Tuner(settings)
    tuner.open_study()
    for n in range(1, settings.trials + 1):
        tuner.s = replace(tuner.s, trials=n)  # the settings are frozen: the next count is new settings
        tuner.run()
        best = tuner.selection().best
        # reached: the tuner's pick is as good as the grid's under the selection's own rule (a tie)
        if best is not None and best.tokens_per_s >= target_tps * (1 - TIE):
            return tuner.finished_count(), best.tokens_per_s
        if tuner.finished_count() < n:  # the sampler exhausted the space
            break
    best = tuner.selection().best
    return None, best.tokens_per_s if best else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="estimate", choices=sorted(CASES))
    ap.add_argument("--max-trials", type=int, default=400)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, budget, space, overrides in CASES[args.backend]:
            s = settings_for(model, budget, space, overrides, args.backend, Path(tmp), args.max_trials)
            t0 = time.perf_counter()
            best, grid = grid_best(s)
            t_grid = time.perf_counter() - t0
            if best is None:
                rows.append((model, budget, space, grid, "-", "no feasible plan", "-", f"{t_grid:.0f}"))
                continue
            t0 = time.perf_counter()
            n, tps = trials_to_reach(s, best.tokens_per_s)
            t_tune = time.perf_counter() - t0
            ratio = f"{100 * n / grid:.1f}%" if n else f">{100 * args.max_trials / grid:.1f}%"
            rows.append((model, budget, space, grid, n or f">{args.max_trials}", best.plan_short, ratio,
                         f"{t_grid:.0f} / {t_tune:.0f}"))
            print(*rows[-1], sep=" | ", flush=True)
    if args.markdown:
        print("\n| model | budget | space | grid plans | trials to reach the grid's best | grid's best | ratio | "
              "seconds (grid / tuner) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(map(str, r)) + " |")


if __name__ == "__main__":
    main()
