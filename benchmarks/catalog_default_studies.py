"""Every catalog model's default study, timed: ``advisor tune --gpu-budget 24GB --model <key>``.

For each key of ``advisor.core.catalog.model_catalog()`` (or those of ``--models``), the command runs as a
user types it (the default backend, the default space), in a child process on a fresh ``--reports-dir``, and
the row records:

- wall time and CPU time of the child (``resource.getrusage(RUSAGE_CHILDREN)``);
- who answered each stage: the estimate stage's answer (closed form, or the simulation for a model the closed
  form cannot describe: ``answered_by`` of ``tune --json``), and how many trials the simulate stage measured;
- the simulations run (``advisor.runtime.simulate.extrapolate.simulate`` calls: whole steps of a plan) and the
  traces they ran (``trace_step`` calls; a trace reused from the cache is not run again);
- the answer (the winner's plan, its run peak and tokens/s).

``--compare FILE`` lays an earlier run's JSON (``--json-out``) beside each row: its wall time, and whether
the answer is the same plan. The goal: 60 s or less per model on an idle 2-core machine.

Run: python benchmarks/catalog_default_studies.py [--models gemma-3-1b,qwen2.5-7b-instruct] [--budget 24GB]
     [--out reports/catalog_default_studies.md] [--json-out FILE] [--compare FILE] [--root CHECKOUT]
     [--timeout 3600] [--render ROWS.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOAL_S = 60.0
"""Seconds per model on an idle 2-core machine."""

# the child: counts the simulations and the traces they run, then runs the command as the CLI does
CHILD = r"""
import json, sys
counts = {"simulations": 0, "traces": 0}
import advisor.runtime.simulate.extrapolate as ex
_simulate, _trace = ex.simulate, ex.trace_step
def simulate(*a, **k):
    counts["simulations"] += 1
    return _simulate(*a, **k)
def trace_step(*a, **k):
    counts["traces"] += 1
    return _trace(*a, **k)
ex.simulate, ex.trace_step = simulate, trace_step
from advisor.cli import main
try:
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as f:
        json.dump(counts, f)
sys.exit(code)
"""


def run_model(key: str, budget: str, root: Path, timeout: float) -> dict[str, Any]:
    """One default study in a child process on a fresh reports directory: its timings, counts and answer."""
    with tempfile.TemporaryDirectory(prefix="catalog-study-") as tmp:
        counts_path = Path(tmp) / "counts.json"
        cmd = [sys.executable, "-c", CHILD, str(counts_path), "tune", "--gpu-budget", budget, "--model", key,
               "--reports-dir", str(Path(tmp) / "reports"), "--json"]
        env = {**os.environ, "PYTHONPATH": str(root)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"model": key, "status": f"timed out after {timeout:.0f} s", "wall_s": timeout}
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        counts = json.loads(counts_path.read_text()) if counts_path.exists() else {}
    row: dict[str, Any] = {"model": key, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), **counts}
    try:
        result = json.loads(done.stdout[done.stdout.index("{"):])
    except ValueError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**row, "status": f"exit {done.returncode}: {tail[:160]}"}
    trials = [t for t in result.get("trials", []) if not t.get("duplicate_of")]
    best = result.get("best") or {}
    described, why = _described(key, [t["plan"] for t in trials if t.get("plan")])
    row.update(status="ok" if best else "no plan fits", backend=result.get("backend"),
               estimate_by=f"closed form {described} of {len(trials)}" if described < len(trials) else "closed form",
               estimate_why=why,
               trials=len(trials), simulated=sum(1 for t in trials if t.get("source") == "simulated"),
               answer=best.get("plan_short"), answer_plan=best.get("plan"), answer_source=best.get("source"),
               run_peak_gib=round((best.get("run_peak_bytes") or best.get("peak_bytes") or 0) / 2**30, 2) or None,
               tokens_per_s=round(best["tokens_per_s"]) if best.get("tokens_per_s") else None)
    return row


def _described(key: str, plans: list[dict[str, Any]]) -> tuple[int, str]:
    """How many of the trials' plans the closed form describes (advisor.memory.closed_form: the others the estimate
    stage cannot answer exactly), and why not for the first it does not."""
    from advisor.core.catalog import resolve_model
    from advisor.core.plan import Plan
    from advisor.memory.closed_form import closed_form_describes

    model = resolve_model(key)
    n, why = 0, ""
    for plan in plans:
        ok, reason = closed_form_describes(model, Plan.from_dict(plan))
        n += ok
        why = why or ("" if ok else reason)
    return n, why


def _short(status: str) -> str:
    """A refusal or failure in a few words (the command's one-line error, its flag and reason)."""
    text = status.split("advisor tune: error: ", 1)[-1]
    return text if len(text) <= 90 else text[:87] + "..."


def markdown(rows: list[dict[str, Any]], budget: str, compare: dict[str, dict[str, Any]], note: str) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# Every catalog model's default study, timed",
        "",
        f"`advisor tune --gpu-budget {budget} --model <key>` on the default backend and space, each on a fresh "
        "`--reports-dir` (benchmarks/catalog_default_studies.py). Goal: "
        f"{GOAL_S:.0f} s or less per model on an idle 2-core machine.",
        "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.node() or 'this machine'}: "
        f"{os.cpu_count()} CPUs, load average {load:.2f} at the end. {note}".rstrip(),
        "",
        "- *estimate by*: the trials' plans the closed form describes (the others: answered by the simulation "
        "before, approximated by the closed form with the finalists simulated now);",
        "- *simulated*: trials the simulate stage measured, of the trials run (repeats left out);",
        "- *simulations / traces*: whole-step simulations run, and the traces they ran (a trace reused from the "
        "cache is not counted again).",
        "",
    ]
    head = ("| model | wall s | CPU s | estimate by | simulated | simulations / traces | answer | run peak GiB "
            "| tokens/s |")
    rule = "|---|---:|---:|---|---:|---:|---|---:|---:|"
    if compare:
        head += " before s | before CPU s | same answer |"
        rule += "---:|---:|---|"
    lines += [head, rule]
    for r in rows:
        if r.get("status") not in ("ok", "no plan fits"):  # refused (a budget below every plan), failed, timed out
            cells = [r["model"], f"{r.get('wall_s', '')}", f"{r.get('cpu_s', '')}", "", "",
                     f"{r.get('simulations', '?')} / {r.get('traces', '?')}", _short(r.get("status", "")), "", ""]
        else:
            cells = [r["model"], f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}", r.get("estimate_by") or "",
                     f"{r.get('simulated', 0)} of {r.get('trials', 0)}",
                     f"{r.get('simulations', '?')} / {r.get('traces', '?')}",
                     f"`{r['answer']}`" if r.get("answer") else r["status"],
                     f"{r['run_peak_gib']}" if r.get("run_peak_gib") else "", f"{r.get('tokens_per_s') or ''}"]
        if compare:
            old = compare.get(r["model"])
            if old is None:
                cells += ["", "", ""]
            elif str(old.get("status", "")).startswith("timed out"):
                cells += [f"> {old['wall_s']:.0f}", "", "not known (timed out)"]
            else:
                same = ("yes" if old.get("answer_plan") == r.get("answer_plan") and _short(old.get("status", ""))
                        == _short(r.get("status", "")) else f"no (was {old.get('answer') or _short(old['status'])})")
                cells += [f"{old.get('wall_s', '')}", f"{old.get('cpu_s', '')}", same]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    slow = [r["model"] for r in rows if (r.get("wall_s") or 0) > GOAL_S]
    lines += ["", f"Over {GOAL_S:.0f} s: {', '.join(slow) if slow else 'none'} (on this machine, at this load)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from advisor.core.catalog import model_catalog

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", help="comma-separated catalog keys (default: every key of the catalog)")
    p.add_argument("--budget", default="24GB", help="the --gpu-budget of every study")
    p.add_argument("--out", default=str(ROOT / "reports" / "catalog_default_studies.md"), help="the markdown table")
    p.add_argument("--json-out", help="also write the rows as JSON (for a later --compare)")
    p.add_argument("--compare", help="a JSON of an earlier run (--json-out): its wall time and answer beside each row")
    p.add_argument("--root", default=str(ROOT), help="the checkout whose advisor runs (default: this one)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before a study is stopped")
    p.add_argument("--note", default="", help="a sentence added under the title (the machine, what ran beside it)")
    p.add_argument("--render", metavar="FILE",
                   help="write the table from the rows of an earlier --json-out; run nothing")
    args = p.parse_args(argv)
    compare = {r["model"]: r for r in json.loads(Path(args.compare).read_text())} if args.compare else {}
    if args.render:
        Path(args.out).write_text(markdown(json.loads(Path(args.render).read_text()), args.budget, compare, args.note))
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    catalog = list(model_catalog())
    keys = [k.strip() for k in args.models.split(",") if k.strip()] if args.models else catalog
    unknown = [k for k in keys if k not in catalog]
    if unknown:
        p.error(f"--models: {unknown[0]!r} is not a catalog key (keys: {', '.join(catalog)})")
    rows = []
    for key in keys:
        print(f"{key}: running `tune --gpu-budget {args.budget}` ...", file=sys.stderr, flush=True)
        row = run_model(key, args.budget, Path(args.root), args.timeout)
        print(f"{key}: {row.get('wall_s')} s wall, {row.get('cpu_s')} s CPU, {row.get('status')}, {row.get('answer')}",
              file=sys.stderr, flush=True)
        rows.append(row)
        if args.json_out:  # after every model: a run stopped half-way keeps what it measured
            Path(args.json_out).write_text(json.dumps(rows, indent=1))
    Path(args.out).write_text(markdown(rows, args.budget, compare, args.note))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
