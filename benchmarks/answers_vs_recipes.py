"""The advisor's answer beside the experts' recipe (../shared/published_runs/recipes.json).

For each recipe: its model and card mapped to the advisor's catalogs (benchmarks/recipe_plans.py with the
tables of benchmarks/answers_vs_recipes.yaml; a model or card the catalogs lack is listed as such), the
recipe expressed as a Plan (what the Plan cannot express is listed), predicted as the tuner predicts a trial
(the estimate backend with the
run's phases: fits or not on the card with the default headroom, tokens/s, the accuracy prior); then
the advisor asked the same question (`advisor tune --backend simulate` on the default space, the
recipe's sequence length, the card's whole memory as the budget), its answer exported and checked by
pre-flight as `advisor preflight out/advisor.yaml --gpu X --gpu-budget 100%` does; and why the two
differ, lever by lever, with the predicted gain and quality difference.

Issue 23's goal: no recipe measured running on its card rejected as not fitting, unless the row shows
with numbers that the published counter leaves something out.

Run: python benchmarks/answers_vs_recipes.py [--recipes 3,5,27] [--out reports/answers_vs_recipes.md]
     [--preflight-backend simulate|estimate] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from advisor.core.catalog import GpuSpec, ModelSpec  # noqa: E402
from advisor.core.errors import AdvisorInputError  # noqa: E402
from advisor.core.fit import HEADROOM, fit_verdict  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402

from recipe_plans import Expression, express, load_recipes, load_tables, recipes_candidates  # noqa: E402 (benchmarks/)

GiB = 2**30
# Plan fields compared between the recipe and the answer, in the order a person reads them
LEVERS = ("method", "quantization", "double_quant", "precision", "lora_r", "lora_targets", "dora", "optimizer",
          "optimizer_in_backward", "gradient_checkpointing", "checkpoint_layers", "activation_offload", "offload",
          "micro_batch", "grad_accum", "packing", "attn_impl", "loss", "expandable_segments")
COUNTER_FIELD = {"allocated": "live_bytes", "active": "live_bytes", "reserved": "reserved_bytes",
                 "nvidia-smi": "peak_bytes"}


# ----------------------------------------------------------------------------- predictions


def predict(model: ModelSpec, plan: Plan, gpu: GpuSpec) -> dict[str, Any]:
    """One plan as the tuner predicts a trial: the estimate backend, the run's phases on this card, the
    step-time model and the quality model's prior (advisor/data/quality.yaml)."""
    from advisor.memory.phases import run_peak_bytes
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases
    from advisor.search.quality import quality_of
    from advisor.speed.throughput import predict_throughput

    report = with_phases(model, plan, gpu, get_backend("estimate").measure(model, plan, gpu))
    peak = run_peak_bytes(report)
    phases = report.run_phases.to_dict() if report.run_phases is not None else {}
    run_phase = report.run_peak_phase
    tp = predict_throughput(model, plan, gpu)
    q = quality_of(plan)
    return {"plan": plan, "run_peak_bytes": peak, "run_peak_phase": run_phase, "phases": phases,
            "host_bytes": report.host_bytes, "ledger": dict(report.device),
            "fit": fit_verdict(peak, gpu.memory_bytes, HEADROOM), "tokens_per_s": tp.tokens_per_s,
            "terms": dict(tp.terms), "accuracy_loss": q.accuracy_loss, "token_factor": q.token_factor,
            "pickable": q.pickable, "uncovered": list(q.uncovered), "notes": list(report.notes)}


def on_counter(pred: dict, counter: str | None) -> dict[str, float]:
    """The predicted run peak read on each counter (the highest train/eval/load phase, as a run reads it)."""
    phases = pred["phases"]
    if not phases:
        return {}
    out = {}
    for name, key in (("allocated", "live_bytes"), ("reserved", "reserved_bytes"), ("nvidia-smi", "peak_bytes")):
        out[name] = max(float(p[key]) for p in phases.values() if p.get("included", True))
    if counter in COUNTER_FIELD:
        out["counter"] = out[{"active": "allocated"}.get(counter, counter)]
    return out


def ask_advisor(ex: Expression, workdir: Path, trials: int | None = None, backend: str = "simulate") -> dict[str, Any]:
    """`advisor tune --model M --gpu G --gpu-budget 100% --backend B seq_len=L` in a fresh study, polished as
    the command does (``trials``: --trials, for a quick run; default the space's)."""
    from advisor.cli import build_parser
    from advisor.commands.tune import build_settings, export_best
    from advisor.search.tuner import Tuner

    argv = ["tune", "--model", ex.model.name, "--gpu", ex.gpu.key, "--gpu-budget", "100%", "--backend", backend,
            "--reports-dir", str(workdir / "reports"), f"seq_len={ex.plan.seq_len}"]
    if trials:
        argv[1:1] = ["--trials", str(trials)]
    settings = build_settings(build_parser().parse_args(argv))
    tuner = Tuner(settings)
    tuner.open_study()
    tuner.run()
    tuner.polish()
    selection = tuner.selection()
    best = selection.best
    shown = [a for i, a in enumerate(argv) if a != "--reports-dir" and (i == 0 or argv[i - 1] != "--reports-dir")]
    out: dict[str, Any] = {"command": "advisor " + " ".join(shown), "explanation": selection.explanation,
                           "best": best, "budget": settings.budget, "own_recipe": selection.recipe}
    if best is not None:
        out["exports"] = export_best(settings, best, str(workdir / "export"))
    return out


def preflight(ex: Expression, advisor_yaml: str, backend: str) -> dict[str, Any]:
    """`advisor preflight advisor.yaml --gpu G --gpu-budget 100% [--backend B]`."""
    from advisor.diagnosis.preflight import PreflightInput, run_preflight

    try:
        res = run_preflight(PreflightInput(config=advisor_yaml, gpu_budget="100%", gpu=ex.gpu.key, backend=backend))
    except AdvisorInputError as e:
        return {"verdict": "BAD INPUT", "findings": [f"pre-flight refused the export: {e}"]}
    except Exception as e:  # noqa: BLE001 - a crash of pre-flight on the advisor's own export is a finding
        return {"verdict": "CRASH", "findings": [f"pre-flight crashed: {type(e).__name__}: {_first_line(e)}"]}
    worst = [f"{f.severity}: {f.title}" for f in res.findings if f.severity in ("error", "warning")]
    return {"verdict": res.verdict, "findings": worst}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:240] if text else ""


def differences(recipe: Plan, answer: Plan) -> list[str]:
    """The levers the answer changes, as 'field: recipe -> answer'."""
    a, b = recipe.to_dict(), answer.to_dict()
    out = []
    for name in LEVERS:
        if name not in a or name not in b or a[name] == b[name]:
            continue
        if name in ("lora_r", "lora_targets", "double_quant") and (recipe.method == "full" or answer.method == "full"):
            continue
        if name == "double_quant" and not (recipe.four_bit and answer.four_bit):
            continue
        out.append(f"{name.replace('_', ' ')} {_show(a[name])} → {_show(b[name])}")
    return out


def term_changes(recipe: dict, answer: dict, n: int = 3) -> list[str]:
    """The step-time terms that move most, in seconds per 1k tokens (the two plans' steps differ in size)."""
    ta, tb = recipe["terms"], answer["terms"]
    ka = recipe["plan"].tokens_per_step / 1000
    kb = answer["plan"].tokens_per_step / 1000
    delta = {k: tb.get(k, 0.0) / kb - ta.get(k, 0.0) / ka for k in set(ta) | set(tb)}
    top = sorted((kv for kv in delta.items() if abs(kv[1]) > 1e-4), key=lambda kv: -abs(kv[1]))[:n]
    return [f"{k} {v * 1000:+.0f} ms" for k, v in top]


def _show(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x).removesuffix("_proj") for x in v)
    return str(v)


# ----------------------------------------------------------------------------- one row


def evaluate(ex: Expression, workdir: Path, preflight_backend: str, trials: int | None = None,
             tune_backend: str = "simulate") -> dict[str, Any]:
    row: dict[str, Any] = {"ex": ex}
    if ex.model is None or ex.plan is None:
        return row
    if ex.gpu is None:
        return row
    row["recipe"] = predict(ex.model, ex.plan, ex.gpu)
    row["recipe_counter"] = on_counter(row["recipe"], ex.counter)
    ask = ask_advisor(ex, workdir, trials, tune_backend)
    row["ask"] = ask
    best = ask["best"]
    if best is None:
        return row
    answer_plan = Plan.from_dict(best.plan)
    row["answer"] = predict(ex.model, answer_plan, ex.gpu)
    # gain in time to quality (token factor / tokens per second), as the selection ranks
    row["gain"] = (row["recipe"]["token_factor"] / row["recipe"]["tokens_per_s"]) / \
        (row["answer"]["token_factor"] / row["answer"]["tokens_per_s"]) - 1
    row["quality"] = row["answer"]["accuracy_loss"] - row["recipe"]["accuracy_loss"]
    row["levers"] = differences(ex.plan, answer_plan)
    row["terms"] = term_changes(row["recipe"], row["answer"])
    advisor_yaml = ask.get("exports", {}).get("advisor")
    row["preflight"] = preflight(ex, advisor_yaml, preflight_backend) if advisor_yaml else \
        {"verdict": "not exported", "findings": []}
    return row


def summary(rows: list[dict]) -> dict[str, Any]:
    measured = [r for r in rows if r["ex"].measured_on_card]
    judged = [r for r in measured if "recipe" in r]
    rejected = [r for r in judged if r["recipe"]["fit"] == "over"]
    tight = [r for r in judged if r["recipe"]["fit"] == "tight"]
    asked = [r for r in rows if "preflight" in r]
    return {"recipes": len(rows), "asked": sum("ask" in r for r in rows), "measured": len(measured),
            "measured_judged": len(judged), "rejected": [r["ex"].rid for r in rejected],
            "tight": [r["ex"].rid for r in tight],
            "answers": len(asked), "go": sum(r["preflight"]["verdict"] == "GO" for r in asked),
            "not_asked": [r["ex"].rid for r in rows if "ask" not in r]}


# ----------------------------------------------------------------------------- the report


def _gib(b: float | None) -> str:
    return "—" if b is None else f"{b / GiB:.1f} GiB"


def _pct(x: float) -> str:
    return f"{x:+.0%}"


def longest_fitting_seq(model: ModelSpec, plan: Plan, gpu: GpuSpec, low: int = 64) -> int | None:
    """The longest sequence at which ``plan`` fits the card (estimate backend, default headroom), by
    bisection below its own length; None when not even ``low`` tokens fit."""
    def fits_at(seq: int) -> bool:
        return predict(model, plan.with_(seq_len=seq), gpu)["fit"] == "fits"

    if not fits_at(low):
        return None
    lo, hi = low, plan.seq_len
    while hi - lo > 16:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_at(mid) else (lo, mid)
    return lo


def counter_evidence(row: dict) -> str:
    """For a recipe the advisor rejects: predicted vs published peak, and on which counter; what the
    counter leaves out when the plan pages its optimizer states; the persistent state the plan must
    hold whatever the counter; the longest sequence at which it fits when its length was assumed."""
    ex, rec = row["ex"], row["recipe"]
    parts = [f"predicted run peak {_gib(rec['run_peak_bytes'])} ({rec['run_peak_phase']}, nvidia-smi level) over "
             f"{_gib(ex.gpu.memory_bytes)} less {HEADROOM:.0%} headroom"]
    c = row.get("recipe_counter") or {}
    if ex.published_peak_bytes is not None:
        if ex.counter in COUNTER_FIELD and "counter" in c:
            parts.append(f"on the published counter ({ex.counter}) predicted {_gib(c['counter'])} vs published "
                         f"{ex.published_peak_text} ({_gib(ex.published_peak_bytes)}), "
                         f"{_pct(c['counter'] / ex.published_peak_bytes - 1)}")
        else:
            parts.append(f"counter not stated ({ex.counter_why}): predicted allocated {_gib(c.get('allocated'))}, "
                         f"reserved {_gib(c.get('reserved'))} vs published {ex.published_peak_text}")
    ledger = rec["ledger"]
    opt = ledger.get("optimizer_states", 0)
    if ex.plan.optimizer.startswith("paged") and opt and "allocated" in c:
        parts.append(f"paged optimizer states {_gib(opt)} on the device in the ledger: bitsandbytes allocates them "
                     "with cudaMallocManaged, which no torch.cuda counter sees, so the counter's view of the "
                     f"prediction is {_gib(c['allocated'] - opt)} allocated")
    held = ("weights", "quant_constants", "adapter_weights", "gradients", "master_weights") + \
        (() if ex.plan.optimizer.startswith("paged") else ("optimizer_states",))  # paged: outside the counters
    floor = sum(ledger.get(k, 0) for k in held)
    if ex.published_peak_bytes is not None and floor > ex.published_peak_bytes:
        parts.append(f"weights, gradients and optimizer states alone hold {_gib(floor)} in this plan, more than the "
                     f"published {ex.published_peak_text}: the published run kept less state than its stated "
                     "configuration implies")
    if ex.seq_assumed:
        longest = longest_fitting_seq(ex.model, ex.plan, ex.gpu)
        parts.append(f"the recipe sets no max_seq_len (asked at {ex.plan.seq_len}); it fits at up to "
                     f"{longest:,} tokens per sequence" if longest else
                     f"the recipe sets no max_seq_len (asked at {ex.plan.seq_len}); it does not fit at any length")
    return "; ".join(parts)


def render(rows: list[dict], summ: dict, recipes_path: str, preflight_backend: str) -> str:
    L = ["# The advisor's answer beside the experts' recipes", "",
         f"Generated by `python benchmarks/answers_vs_recipes.py` from `{recipes_path}` (the mapping tables: "
         "`benchmarks/answers_vs_recipes.yaml`). For each recipe on the card it names, the recipe as the advisor "
         "predicts it (estimate backend with the run's phases, the step-time model, the quality model), the "
         f"advisor's own answer to the same question (`advisor tune --backend {summ['tune_backend']}` on the default "
         "space at the "
         f"recipe's sequence length, the card's whole memory as the budget, headroom {HEADROOM:.0%}), that answer's "
         f"pre-flight on its exported advisor.yaml (`advisor preflight --backend {preflight_backend}`), and why "
         "the two "
         "differ. Gain: the answer's predicted time to quality (token factor / tokens per second, as the selection "
         "ranks) "
         "over the recipe's. Prior loss: the quality model's accuracy loss (`advisor/data/quality.yaml`, nats/token of "
         "excess held-out loss against the reference training; lower is better); quality: the answer's minus the "
         "recipe's. Every figure is predicted, none measured here.", "",
         "## Summary", "",
         f"- Recipes: {summ['recipes']}; asked (model and card in the catalogs, the recipe a valid Plan): "
         f"{summ['asked']}; not asked: {', '.join(summ['not_asked']) or 'none'}.",
         f"- Measured running on their card: {summ['measured']} ({summ['measured_judged']} with model and plan "
         f"expressible). Rejected by the advisor as not fitting: **{len(summ['rejected'])}**"
         + (f" ({', '.join(summ['rejected'])}; numbers in their rows)" if summ["rejected"] else "")
         + (f"; into the headroom but within the card: {', '.join(summ['tight'])}" if summ["tight"] else "") + ".",
         f"- Answers that pass pre-flight (GO): **{summ['go']} of {summ['answers']}**.", ""]
    not_go = [r for r in rows if r.get("preflight", {}).get("verdict", "GO") != "GO"]
    if not_go:
        L += [f"Answers pre-flight does not pass, with its reason (the tune asked the {summ['tune_backend']} backend; "
              f"pre-flight checks with {preflight_backend}):", ""]
        L += [f"- {r['ex'].rid}: {r['preflight']['verdict']}: " + "; ".join(r["preflight"]["findings"][:1]) + "."
              for r in not_go]
        L.append("")
    rejected = [r for r in rows if r["ex"].rid in summ["rejected"]]
    if rejected:
        L += ["Measured recipes the advisor rejects, with the numbers:", ""]
        L += [f"- {r['ex'].rid} ({r['ex'].recipe['source_project']}, {r['ex'].recipe['model']} on "
              f"{r['ex'].gpu.name}): {counter_evidence(r)}." for r in rejected]
        L.append("")
    L += ["## Recipes", "",
          "| id | recipe (as a Plan) | card | recipe predicted | published | advisor's answer | gain · quality | "
          "pre-flight | why they differ |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(_row(r))
    L += ["", "## Notes per recipe", ""]
    for r in rows:
        ex = r["ex"]
        notes = [n for n in (ex.model_note, ex.gpu_note) if n]
        if ex.seq_assumed:
            notes.append(f"no max_seq_len in the recipe: asked at {ex.plan.seq_len if ex.plan else '?'} tokens")
        if ex.cannot:
            notes.append("not expressed: " + "; ".join(ex.cannot))
        if ex.counter:
            notes.append(f"published peak counter: {ex.counter} ({ex.counter_why})")
        if "recipe" in r and r["ex"].published_peak_bytes is not None and r.get("recipe_counter"):
            c = r["recipe_counter"]
            notes.append(f"predicted allocated {_gib(c.get('allocated'))}, reserved {_gib(c.get('reserved'))}, "
                         f"nvidia-smi {_gib(c.get('nvidia-smi'))} vs published {ex.published_peak_text}")
        if "ask" in r:
            notes.append(f"asked: `{r['ask']['command']}`")
        if r.get("preflight", {}).get("findings"):
            notes.append("pre-flight: " + "; ".join(r["preflight"]["findings"][:3]))
        L.append(f"- **{ex.rid}**: " + ("; ".join(notes) if notes else "—") + ".")
    L.append("")
    return "\n".join(L)


def _row(r: dict) -> str:
    ex = r["ex"]
    rec = ex.recipe
    recipe_plan = ex.plan.short() if ex.plan else "—"
    card = ex.gpu.name if ex.gpu else f"({rec.get('target_gpu')})"
    pub = []
    if ex.published_oom:
        pub.append("OOM")
    elif ex.published_peak_text:
        pub.append(ex.published_peak_text + (f" ({ex.counter})" if ex.counter else ""))
    if ex.published_tokens_per_s:
        pub.append(f"{ex.published_tokens_per_s:,.0f} tok/s")
    pub_s = "; ".join(pub) or "—"
    head = (f"| {ex.rid} ({rec['source_project'].split()[0]}, {rec.get('claim', '').split()[0]}) | {recipe_plan} "
            f"| {card} |")
    if "recipe" not in r:
        why = ex.model_note if ex.model is None else ex.gpu_note if ex.gpu is None else "; ".join(ex.cannot)
        return head + f" not asked: {why} | {pub_s} | — | — | — | — |"
    p = r["recipe"]
    verdict = {"fits": "fits", "tight": "TIGHT", "over": "DOES NOT FIT"}[p["fit"]]
    recipe_s = (f"{verdict}: {_gib(p['run_peak_bytes'])} of {_gib(ex.gpu.memory_bytes)}; "
                f"{p['tokens_per_s']:,.0f} tok/s; prior loss {p['accuracy_loss']:.3f}")
    if "answer" not in r:
        return head + f" {recipe_s} | {pub_s} | no plan fits | — | — | — |"
    a = r["answer"]
    answer_s = (f"{a['plan'].short()}: {_gib(a['run_peak_bytes'])}; {a['tokens_per_s']:,.0f} tok/s; "
                f"prior loss {a['accuracy_loss']:.3f}")
    gq = f"{_pct(r['gain'])} · {r['quality']:+.3f}"
    pf = r["preflight"]["verdict"]
    why = "; ".join(r["levers"]) or "same plan"
    if r["terms"]:
        why += " (per 1k tokens: " + ", ".join(r["terms"]) + ")"
    return head + f" {recipe_s} | {pub_s} | {answer_s} | {gq} | {pf} | {why} |"


# ----------------------------------------------------------------------------- main


def run(ids: list[str] | None, out: Path, recipes_file: Path | None, preflight_backend: str,
        workdir: Path | None = None, progress: bool = True, trials: int | None = None,
        tune_backend: str = "simulate") -> tuple[list[dict], dict]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tables = load_tables()
    path = recipes_file or next((p for p in recipes_candidates() if p.is_file()), None)
    recipes = load_recipes(path)
    if ids:
        known = {str(r["id"]) for r in recipes}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise AdvisorInputError("--recipes", f"no such recipe id(s) in {path}", ",".join(unknown))
        recipes = [r for r in recipes if str(r["id"]) in ids]
    rows = []
    own_tmp = workdir is None
    base = Path(tempfile.mkdtemp(prefix="answers_vs_recipes-")) if own_tmp else workdir
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress) as bar:
        task = bar.add_task("recipes", total=len(recipes))
        for recipe in recipes:
            bar.update(task, description=f"recipe {recipe['id']} ({recipe['model']})")
            ex = express(recipe, tables)
            rows.append(evaluate(ex, base / f"recipe-{ex.rid}", preflight_backend, trials, tune_backend))
            bar.advance(task)
    summ = {**summary(rows), "tune_backend": tune_backend}
    out.parent.mkdir(parents=True, exist_ok=True)
    shown = str(path)
    for prefix in (str(ROOT.parent / "shared"), "/work/shared"):
        shown = shown.replace(prefix, "../shared")
    out.write_text(render(rows, summ, shown, preflight_backend), encoding="utf-8")
    if own_tmp:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return rows, summ


def main(argv: list[str] | None = None) -> int:
    from advisor.cli import _quiet_libraries

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", help="comma-separated recipe ids to run (default: all)")
    ap.add_argument("--recipes-file", type=Path, help="published_runs/recipes.json")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "answers_vs_recipes.md")
    ap.add_argument("--preflight-backend", choices=("simulate", "estimate"), default="simulate",
                    help="the memory check of pre-flight (advisor preflight's default: simulate)")
    ap.add_argument("--tune-backend", choices=("simulate", "estimate"), default="simulate",
                    help="the tune's last stage (advisor tune's default without a GPU: simulate)")
    ap.add_argument("--workdir", type=Path, help="keep the studies and exports here (default: a temporary folder)")
    ap.add_argument("--trials", type=int, help="trials per question (default: the space's; fewer for a quick look)")
    args = ap.parse_args(argv)
    _quiet_libraries()
    ids = [i.strip() for i in args.recipes.split(",") if i.strip()] if args.recipes else None
    try:
        _, summ = run(ids, args.out, args.recipes_file, args.preflight_backend, args.workdir, trials=args.trials,
                      tune_backend=args.tune_backend)
    except AdvisorInputError as e:
        print(f"answers_vs_recipes: error: {e}", file=sys.stderr)
        return 2
    print(f"{summ['recipes']} recipes, {summ['asked']} asked; measured on their card: {summ['measured']}, "
          f"rejected as not fitting: {len(summ['rejected'])} {summ['rejected']}; answers GO: "
          f"{summ['go']} of {summ['answers']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
