"""GPU validation: real probes against the simulated and analytic ledgers, written to reports/gpu_validation.md.

    python benchmarks/gpu_validation.py                       # one GPU: Qwen2.5 0.5B / 1.5B / 7B, < 8 minutes
    python benchmarks/gpu_validation.py --device cpu --tiny   # CPU, tiny models (what CI runs):
                                                                reports/gpu_validation_cpu.md

For each model (random initialization from the catalog config: nothing is downloaded) and each plan
of the matrix (full, LoRA, QLoRA x gradient checkpointing x micro-batch), it runs a real probe in a
child process (advisor.runtime.probe.run_probe: warm-up step, measured steps, peak memory from the caching
allocator and NVML) and compares the peak with the simulate backend (a fake-tensor trace of the
same step, when registered) and the estimate backend (the closed-form ledger). Errors are
(predicted - measured) / measured: tensors against torch.cuda.max_memory_allocated (on the CPU
against the live-bytes tracker), the simulation's reserved peak (its allocations replayed through
the caching-allocator model, advisor.memory.allocator) against torch.cuda.max_memory_reserved,
whole-process predictions against NVML. A second table gives the run's phases (advisor.memory.phases:
load, train, eval, generate, save) as predicted, next to what the probe measured of them (its
build-and-load and its steps; it runs no evaluation, generation or save). Each probe's tokens/s is
shown beside the step-time model's uncalibrated prediction for the same GPU (advisor/speed).

On a GPU a last section squeezes one plan: the probe with the largest gap between reserved and
allocated memory runs again under budgets that leave the caching allocator less than it reserved
(set_per_process_memory_fraction), and the table gives the step time and the cudaMalloc retries
(num_alloc_retries) at each: what memory pressure costs in speed, which the step-time model does not
model yet (issue 14's Liger baselines at micro-batch 32 are the suspected case). A wall-clock budget
(--max-minutes) skips what would not fit and says so in the report.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GPU_MODELS = ("qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-7b-instruct")


@dataclass
class Row:
    model: str
    plan: Any
    probe: Any = None
    sim: Any = None
    sim_error: str = ""
    est: Any = None
    tokens_per_s: float | None = None  # predicted by the step-time model (advisor/speed), uncalibrated
    notes: list[str] = field(default_factory=list)


def matrix(tiny: bool) -> list[Any]:
    """full / lora / qlora x checkpointing x micro-batch (seq 1024 on a GPU, 64 on tiny CPU models)."""
    from advisor.core.plan import Plan

    if tiny:
        seq = 64
        return [Plan(method="full", seq_len=seq), Plan(method="lora", seq_len=seq, lora_dropout=0.0),
                Plan(method="qlora", quantization="nf4", seq_len=seq, gradient_checkpointing=True, lora_dropout=0.0,
                     micro_batch=2)]
    plans = []
    for method in ("full", "lora", "qlora"):
        for ckpt, batch in ((False, 1), (True, 1), (True, 4)):
            plans.append(Plan(method=method, quantization="nf4" if method == "qlora" else "none", seq_len=1024,
                              micro_batch=batch, gradient_checkpointing=ckpt, lora_dropout=0.0))
    return plans


def long_loss_plans(model: str, tiny: bool) -> list[Any]:
    """Qwen's LoRA profile at 8192 tokens (benchmarks/qwen_lora_sweep.yaml; finetune.py's LoRA, checkpointing) on
    the 1.5B model, whose vocabulary is Qwen-1's (151,936): the loss's logits blocks, each 4.6 GiB in fp32, are
    what the published figures at 8192 tokens and the replayed fragmentation disagree on (reports/
    memory_vs_published.md, Qwen's sweep)."""
    from advisor.core.plan import Plan

    if tiny or model != "qwen2.5-1.5b-instruct":
        return []
    return [Plan(method="lora", seq_len=8192, micro_batch=1, gradient_checkpointing=True, lora_r=64, lora_alpha=16.0,
                 lora_dropout=0.05, lora_targets="all-linear")]


def models(tiny: bool) -> list[Any]:
    from advisor.core.catalog import resolve_model

    if tiny:
        from advisor.runtime.simulate.tiny import tiny_spec

        return [tiny_spec("qwen2", num_layers=2, vocab_size=512)]
    return [resolve_model(m) for m in GPU_MODELS]


def simulate_one(spec: Any, plan: Any, gpu: Any) -> Any:
    """The simulate backend's report with the run's phases (None when it is not registered)."""
    from advisor.runtime.backends import available, get_backend

    if "simulate" not in available():
        return None
    return _with_phases(spec, plan, gpu, get_backend("simulate")(spec, plan, gpu))


def _with_phases(spec: Any, plan: Any, gpu: Any, report: Any) -> Any:
    """``report`` with its run's phases (advisor.runtime.phases), or as it is where phases are not available."""
    try:
        from advisor.runtime.phases import with_phases
    except ImportError:
        return report
    try:
        return with_phases(spec, plan, gpu, report)
    except Exception as e:  # noqa: BLE001 - a phase that cannot be predicted is a note, never fatal
        from dataclasses import replace

        return replace(report, extra={**report.extra, "phases_error": f"{type(e).__name__}: {e}"[:120]})


def _pct(pred: float | None, meas: float | None) -> str:
    if not pred or not meas:
        return "n/a"
    return f"{100 * (pred - meas) / meas:+.1f}%"


def _gib(n: float | None, tiny: bool) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**20:.2f} MiB" if tiny else f"{n / 2**30:.2f} GiB"


def _retries(p: Any) -> str:
    return str(p.alloc_retries) if p is not None and p.alloc_retries is not None else "n/a"


def render(rows: list[Row], *, device: str, tiny: bool, gpu: Any, elapsed: float, versions: dict,
           squeezes: list[Squeeze] = ()) -> str:
    measured_total = "NVML" if device == "cuda" else "tracker"
    head = [
        "# GPU validation: measured vs simulated vs analytic peaks", "",
        f"Generated by `python benchmarks/gpu_validation.py --device {device}{' --tiny' if tiny else ''}` "
        f"in {elapsed:.0f} s on {gpu.name if gpu else 'the CPU'}.",
        "Weights are random (initialized from each catalog config); memory and speed do not depend on their values.",
        *(["This is the CPU form (tiny models, every tensor in host memory): it checks the probe and the "
           "comparison end to end; the GPU numbers are in reports/gpu_validation.md when that has been run "
           "on a GPU."] if device == "cpu" else []),
        "Every probe: 1 warm-up + 2 measured optimizer steps in a child process. tensor peak = "
        "`torch.cuda.max_memory_allocated` (CPU: the live-bytes tracker); NVML = the whole process (CUDA context "
        "included). Errors are (predicted - measured) / measured: tensor peaks against torch, whole-process "
        "predictions against NVML.", "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v), "",
        f"| model | plan | status | tensor peak | reserved | {measured_total} | simulated tensors (err) | "
        "simulated total (err) | analytic total (err) | tokens/s | predicted tokens/s (err) | step ms | "
        "alloc retries | simulated reserved (err) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    body = []
    for r in rows:
        p = r.probe
        status = p.status if p else "skipped"
        meas_t = p.peak_allocated_bytes if p else None
        meas_w = (p.nvml_peak_bytes if device == "cuda" else p.peak_allocated_bytes) if p else None
        if r.sim is not None:
            sim_t = f"{_gib(r.sim.tensor_peak_bytes, tiny)} ({_pct(r.sim.tensor_peak_bytes, meas_t)})"
            sim_w = (f"{_gib(r.sim.peak_bytes, tiny)} ({_pct(r.sim.peak_bytes, meas_w)})" if device == "cuda"
                     else "n/a (CPU: no GPU overhead)")
        else:
            sim_t = sim_w = "n/a" + (f" ({r.sim_error})" if r.sim_error else "")
        est_w = (f"{_gib(r.est.peak_bytes if device == 'cuda' else r.est.tensor_peak_bytes, tiny)} "
                 f"({_pct(r.est.peak_bytes if device == 'cuda' else r.est.tensor_peak_bytes, meas_w)})"
                 if r.est is not None else "n/a")
        tps = f"{p.tokens_per_s:,.0f}" if p and p.tokens_per_s else "n/a"
        pred_tps = (f"{r.tokens_per_s:,.0f} ({_pct(r.tokens_per_s, p.tokens_per_s if p else None)})"
                    if r.tokens_per_s else "n/a")
        retries = _retries(p)
        ms = f"{p.step_time_median_s * 1e3:.0f}" if p and p.step_time_median_s else "n/a"
        reserved = _gib(p.peak_reserved_bytes, tiny) if p else "n/a"
        nvml = _gib(meas_w, tiny) if device == "cuda" else _gib(meas_t, tiny)
        status_cell = status + (f": {p.message}" if p and p.message else "")
        sim_r = getattr(r.sim, "reserved_peak_bytes", None) if r.sim is not None else None
        sim_res = (f"{_gib(sim_r, tiny)} ({_pct(sim_r, p.peak_reserved_bytes if p else None)})" if sim_r
                   else "n/a")
        body.append(f"| {r.model} | {r.plan.short()} | {status_cell} | {_gib(meas_t, tiny)} | {reserved} | {nvml} | "
                    f"{sim_t} | {sim_w} | {est_w} | {tps} | {pred_tps} | {ms} | {retries} | {sim_res} |")
    notes = sorted({n for r in rows for n in r.notes})
    tail = ["", "Notes:"] + [f"- {n}" for n in notes] if notes else []
    return "\n".join(head + body + phase_table(rows, device=device, tiny=tiny)
                     + pressure_table(list(squeezes), device=device) + tail) + "\n"


# budgets of the pressure section: the unconstrained NVML peak less this share of (reserved - allocated)
SQUEEZE = (0.5, 0.9)


@dataclass
class Squeeze:
    row: Row
    budget: int
    share: float
    probe: Any = None


def pressure_runs(rows: list[Row]) -> list[Squeeze]:
    """Budgets that squeeze the probe with the largest reserved - allocated gap (none without one >= 256 MiB)."""
    ok = [r for r in rows if r.probe is not None and r.probe.ok and r.probe.nvml_peak_bytes
          and r.probe.peak_reserved_bytes]
    if not ok:
        return []
    gap = lambda r: r.probe.peak_reserved_bytes - r.probe.peak_allocated_bytes  # noqa: E731
    base = max(ok, key=gap)
    if gap(base) < 256 * 2**20:
        return []
    return [Squeeze(base, int(base.probe.nvml_peak_bytes - share * gap(base)), share) for share in SQUEEZE]


def pressure_table(squeezes: list[Squeeze], *, device: str) -> list[str]:
    lines = ["", "## Memory pressure: step time when the allocator gets less than it reserved", ""]
    if device != "cuda":
        return lines + ["CUDA only (the caching allocator's retries do not exist on the CPU)."]
    if not squeezes:
        return lines + ["Not run: no probe left a reserved - allocated gap of at least 256 MiB, or no time was left."]
    base = squeezes[0].row
    bp = base.probe
    lines += [f"{base.model} · {base.plan.short()}: unconstrained, allocated {_gib(bp.peak_allocated_bytes, False)}, "
              f"reserved {_gib(bp.peak_reserved_bytes, False)}, NVML {_gib(bp.nvml_peak_bytes, False)}. Each "
              "budget is that NVML peak less a share of the gap (reserved - allocated); the allocator must free "
              "cached blocks and retry cudaMalloc to stay within it.", "",
              "| budget | share of the gap taken away | status | step ms (vs unconstrained) | tokens/s | "
              "alloc retries | reserved |", "|---|---|---|---|---|---|---|",
              f"| none | 0 | {bp.status} | {bp.step_time_median_s * 1e3:.0f} | {bp.tokens_per_s:,.0f} | "
              f"{_retries(bp)} | {_gib(bp.peak_reserved_bytes, False)} |"]
    for q in squeezes:
        p = q.probe
        if p is None:
            lines.append(f"| {_gib(q.budget, False)} | {q.share:.0%} | skipped (time) | | | | |")
            continue
        ms = (f"{p.step_time_median_s * 1e3:.0f} ({_pct(p.step_time_median_s, bp.step_time_median_s)})"
              if p.ok and p.step_time_median_s else "n/a")
        tps = f"{p.tokens_per_s:,.0f}" if p.ok and p.tokens_per_s else "n/a"
        res = f"{p.peak_reserved_bytes / 2**30:.2f} GiB" if p.peak_reserved_bytes else "n/a"
        lines.append(f"| {_gib(q.budget, False)} | {q.share:.0%} | {p.status}{': ' + p.message if p.message else ''} "
                     f"| {ms} | {tps} | {_retries(p)} | {res} |")
    return lines


def phase_table(rows: list[Row], *, device: str, tiny: bool) -> list[str]:
    """The run's phases as predicted (the simulation's, else the estimate's), beside what the probe measured.

    The probe measures two of them: its build-and-load (``load_peak_bytes``, ``load_reserved_bytes``)
    and its training steps (the step peaks above); evaluation, generation and saving are predicted only.
    """
    lines = ["", "## Phases of the run", "",
             "Predicted per phase (live = allocated tensors, reserved = the caching allocator's segments); "
             "measured where the probe runs that phase (load: the probe's build and load of the model; train: its "
             "steps). The probe builds the model with the advisor's own setup, not `from_pretrained`, so the "
             "load comparison checks the order of magnitude more than the exact peak.", "",
             "| phase | model · plan | predicted live | measured live (err) | predicted reserved | "
             "measured reserved (err) | source |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        rep = r.sim if getattr(r.sim, "run_phases", None) is not None else r.est
        run = getattr(rep, "run_phases", None) if rep is not None else None
        phases = run.to_dict() if run is not None else None
        if not phases:
            continue
        p = r.probe if r.probe is not None and r.probe.ok else None
        measured = {"load": ((p.load_peak_bytes, getattr(p, "load_reserved_bytes", None)) if p else (None, None)),
                    "train": ((p.peak_allocated_bytes, p.peak_reserved_bytes) if p else (None, None))}
        for name, ph in phases.items():
            if not ph.get("included", True):
                continue
            live, res = ph.get("live_bytes"), ph.get("reserved_bytes")
            m_live, m_res = measured.get(name, (None, None))
            ml = f"{_gib(m_live, tiny)} ({_pct(live, m_live)})" if m_live else "not measured"
            mr = (f"{_gib(m_res, tiny)} ({_pct(res, m_res)})" if m_res
                  else "n/a (CPU)" if device == "cpu" and m_live else "not measured")
            lines.append(f"| {name} | {r.model} · {r.plan.short()} | {_gib(live, tiny)} | {ml} | {_gib(res, tiny)} | "
                         f"{mr} | {ph.get('source', rep.source)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny models (for the CPU and CI)")
    ap.add_argument("--out", help="default: reports/gpu_validation.md (cuda), reports/gpu_validation_cpu.md (cpu)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per probe")
    ap.add_argument("--limit", type=int, help="run only the first N (model, plan) pairs")
    ap.add_argument("--max-minutes", type=float, default=7.5, help="wall-clock budget; later probes are skipped")
    args = ap.parse_args(argv)

    from advisor.runtime.backends import get_backend
    from advisor.core.catalog import detect_gpu
    from advisor.runtime.probe import run_probe
    from advisor.speed.throughput import predict_throughput

    t0 = time.monotonic()
    gpu = detect_gpu() if args.device == "cuda" else None
    estimate = get_backend("estimate")
    rows = [Row(spec.name, plan) for spec in models(args.tiny)
            for plan in matrix(args.tiny) + long_loss_plans(spec.name, args.tiny)][:args.limit]
    specs = {spec.name: spec for spec in models(args.tiny)}
    # simulations run on the CPU beside the GPU probes (spawned processes: no torch state shared)
    pool = cf.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) \
        if args.device == "cuda" else None
    futures = {}
    for i, r in enumerate(rows):
        r.est = _with_phases(specs[r.model], r.plan, gpu, estimate(specs[r.model], r.plan, gpu))
        if gpu is not None:
            r.tokens_per_s = predict_throughput(specs[r.model], r.plan, gpu, calibrated=False).tokens_per_s
        if pool is not None:
            futures[i] = pool.submit(simulate_one, specs[r.model], r.plan, gpu)
    versions: dict = {}
    deadline = t0 + args.max_minutes * 60
    for i, r in enumerate(rows):
        left = deadline - time.monotonic()
        if left < 20:
            r.notes.append("some probes were skipped: the wall-clock budget (--max-minutes) ran out")
            continue
        r.probe = run_probe(specs[r.model], r.plan, device=args.device, steps=args.steps, warmup=1,
                            timeout=min(args.timeout, left))
        versions = versions or dict(r.probe.versions)
        print(f"[{time.monotonic() - t0:5.0f} s] {r.model} {r.plan.short()}: {r.probe.status} "
              f"{r.probe.message}", flush=True)
        if pool is None:
            try:
                r.sim = simulate_one(specs[r.model], r.plan, gpu)
            except Exception as e:  # noqa: BLE001 - reported in the table, never fatal
                r.sim_error = f"{type(e).__name__}: {e}"[:120]
    for i, fut in futures.items():
        try:
            rows[i].sim = fut.result(timeout=max(1.0, deadline + 20 - time.monotonic()))
        except Exception as e:  # noqa: BLE001
            rows[i].sim_error = f"{type(e).__name__}: {e}"[:120]
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    squeezes = pressure_runs(rows) if args.device == "cuda" else []
    for q in squeezes:
        left = deadline + 120 - time.monotonic()  # the pressure section may use two minutes past the matrix's budget
        if left < 30:
            break
        q.probe = run_probe(specs[q.row.model], q.row.plan, device="cuda", steps=args.steps, warmup=1,
                            timeout=min(args.timeout, left), memory_limit_bytes=q.budget)
        print(f"[{time.monotonic() - t0:5.0f} s] squeezed to {q.budget / 2**30:.2f} GiB: {q.probe.status} "
              f"{q.probe.message}", flush=True)
    out = Path(args.out or ROOT / "reports" / ("gpu_validation.md" if args.device == "cuda"
                                               else "gpu_validation_cpu.md"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(rows, device=args.device, tiny=args.tiny, gpu=gpu, elapsed=time.monotonic() - t0,
                          versions=versions, squeezes=squeezes), encoding="utf-8")
    print(f"wrote {out}")
    return 0 if all(r.probe is not None and r.probe.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
