"""ms-swift's one-change ablations (../shared/published_runs/ms_swift_benchmark.json) against the
step-time model: for each pair, the predicted speed ratio beside the published one, the order check
where the published gap is over 10%, and issue 23's goal for QLoRA (predicted QLoRA/LoRA ratio within
15% of the published one).

How each point is expressed: benchmarks/ms_swift_ablations.yaml. ms-swift timed samples/s of one
dataset of variable-length samples (not padded to the maximum, not packed), so a point is predicted
over a length profile of that dataset (DataProfile: a micro-batch is padded to its longest sample)
and its samples/s is the predicted real tokens/s over the mean sample length.

A section of reports/throughput_vs_published.md (benchmarks/throughput_vs_published.py imports this
module). Alone: python benchmarks/ms_swift_ablations.py [--fit]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from advisor.core.catalog import resolve_gpu, resolve_model  # noqa: E402
from advisor.core.data_profile import DataProfile  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.speed.inputs import constants  # noqa: E402
from advisor.speed.throughput import predict_throughput  # noqa: E402

SPEC = ROOT / "benchmarks" / "ms_swift_ablations.yaml"
MODELS = ROOT / "benchmarks" / "published_models"
GPU = "a100-80gb"
GAP = 0.10
QUANTILES = 2000
DEQUANT_GRID = [0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.11, 0.12, 0.14, 0.16, 0.2, 0.3, 0.5, 0.8]
# points of other tables where the two ran at near-equal speed (context for the amortization table)
NEAR_EQUAL = [
    ("TT3B-09 -> TT3B-10", "torchtune LoRA -> QLoRA, Llama-3.2-3B, 2 x 4096 packed, torch.compile, torchao NF4 "
     "(not bitsandbytes)", 8035 / 8210),
    ("Qwen README L=8192", "Qwen-7B LoRA -> Q-LoRA (GPTQ int4 via auto-gptq, not bitsandbytes), 1 x 8192, "
     "21.3 -> 22.3 s/it", 21.3 / 22.3),
]


def data_candidates() -> list[Path]:
    env = os.environ.get("ADVISOR_PUBLISHED_RUNS")
    out = [Path(env) / "ms_swift_benchmark.json"] if env else []
    return out + [ROOT.parent / "shared" / "published_runs" / "ms_swift_benchmark.json",
                  ROOT.parent.parent / "shared" / "published_runs" / "ms_swift_benchmark.json",
                  Path("/work/shared/published_runs/ms_swift_benchmark.json")]


def load_spec(path: Path = SPEC) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def dataset_lengths() -> tuple[int, ...]:
    """The dataset's sample lengths, modelled (ms_swift_ablations.yaml dataset_lengths): lognormal
    with the published mean and standard deviation (sigma^2 = ln(1 + (std/mean)^2), mu = ln(mean) -
    sigma^2/2), clipped to the published min and max, one length per quantile."""
    d = load_spec()["dataset_lengths"]
    s2 = math.log(1 + (d["std"] / d["mean"]) ** 2)
    mu, sigma = math.log(d["mean"]) - s2 / 2, math.sqrt(s2)
    nd = NormalDist(mu, sigma)
    return tuple(int(min(d["max"], max(d["min"], round(math.exp(nd.inv_cdf((i + 0.5) / QUANTILES))))))
                 for i in range(QUANTILES))


def profile(seq_len: int, how: str) -> DataProfile:
    """The samples a point trains on: ``delete`` keeps those of at most seq_len tokens (ms-swift's
    default truncation_strategy in January 2024); ``truncate`` cuts every sample to seq_len
    (truncation_left in December 2023)."""
    lengths = dataset_lengths()
    kept = [n for n in lengths if n <= seq_len] if how == "delete" else [min(n, seq_len) for n in lengths]
    return DataProfile(lengths=tuple(kept), source="ms_swift_ablations.yaml dataset_lengths", how=f"modelled ({how})")


def expression(point: dict):
    model = resolve_model(str(MODELS / point["model"]))
    plan = Plan.from_dict(dict(point["plan"]))
    return model, plan


def predict(point: dict, stack: dict, k: dict | None = None) -> dict:
    """Predicted samples/s of one point over its length profile, and the figures behind it."""
    model, plan = expression(point)
    prof = profile(plan.seq_len, point["lengths"])
    tp = predict_throughput(model, plan, resolve_gpu(GPU), calibrated=False, k=k, stack=stack, data=prof)
    mean = prof.mean_tokens(plan.seq_len)
    return {"samples_per_s": tp.tokens_per_s / mean, "mean_tokens": mean, "tp": tp,
            "padded": prof.expected_padded(plan.seq_len, plan.micro_batch)}


def speed(point: dict) -> float:
    """The published figure as a speed (minutes for 1000 samples become samples per minute)."""
    return 1.0 / point["published"] if point.get("unit") == "minutes" else point["published"]


def evaluate(spec: dict, k: dict | None = None) -> list[dict]:
    """One row per ablation: published and predicted ratio b/a, the order and goal checks."""
    stack = dict(spec.get("swift_stack") or {})
    pts = spec["points"]
    preds = {pid: predict(pt, stack, k) for pid, pt in pts.items()}
    rows = []
    for ab in spec["ablations"]:
        a, b = pts[ab["a"]], pts[ab["b"]]
        pub = speed(b) / speed(a)
        pred = preds[ab["b"]]["samples_per_s"] / preds[ab["a"]]["samples_per_s"]
        same = (pred > 1) == (pub > 1)
        row = {**ab, "published": pub, "predicted": pred, "pred_a": preds[ab["a"]], "pred_b": preds[ab["b"]],
               "order_checked": abs(pub - 1) > GAP and not ab.get("bound"), "same_order": same}
        row["order_ok"] = same or not row["order_checked"]
        if "ratio_within" in ab:
            row["ratio_error"] = pred / pub - 1
            row["ratio_ok"] = abs(row["ratio_error"]) <= ab["ratio_within"]
        if ab.get("bound"):
            row["bound_ok"] = pred <= pub
        rows.append(row)
    return rows


def amortization(k: dict | None = None) -> list[tuple[str, float]]:
    """Predicted QLoRA/LoRA speed ratio of ms-swift's Qwen-7B plans at uniform lengths (every row
    seq_len tokens): the dequantization is paid once per micro-batch, so the gap closes with its tokens."""
    spec = load_spec()
    stack = dict(spec.get("swift_stack") or {})
    model, gpu = resolve_model(str(MODELS / "qwen-7b-chat")), resolve_gpu(GPU)
    lora = Plan.from_dict(dict(spec["points"]["swift-jan24-qwen7b-lora-r8-L2048-bs1"]["plan"]))
    qlora = Plan.from_dict(dict(spec["points"]["swift-jan24-qwen7b-qlora-bnb4-L2048"]["plan"]))
    out = []
    for mb, seq in ((1, 512), (1, 2048), (2, 4096), (1, 8192), (8, 2048)):
        shape = dict(micro_batch=mb, seq_len=seq, grad_accum=max(1, 16 // mb))
        a = predict_throughput(model, lora.with_(**shape), gpu, calibrated=False, k=k, stack=stack)
        b = predict_throughput(model, qlora.with_(**shape), gpu, calibrated=False, k=k, stack=stack)
        out.append((f"{mb} x {seq}", b.tokens_per_s / a.tokens_per_s))
    return out


def fit(spec: dict) -> tuple[float, float, list[dict]]:
    """Grid search of dequant_4bit_bandwidth_efficiency minimizing the mean |log(predicted / published)|
    of the QLoRA ratios (the pairs with ``ratio_within``)."""
    best = None
    for eff in DEQUANT_GRID:
        k = dict(constants(), dequant_4bit_bandwidth_efficiency=eff)
        rows = [r for r in evaluate(spec, k) if "ratio_within" in r]
        obj = sum(abs(math.log(r["predicted"] / r["published"])) for r in rows) / len(rows)
        if best is None or obj < best[1]:
            best = (eff, obj, rows)
    return best


def check_copies(spec: dict, data_path: Path | None) -> list[str]:
    """Published values in the YAML against the JSON (the JSON is the source of truth)."""
    if data_path is None:
        return ["published_runs/ms_swift_benchmark.json not found: the values copied in ms_swift_ablations.yaml "
                "were used"]
    data = {p["id"]: p for p in json.loads(data_path.read_text(encoding="utf-8"))}
    problems = []
    for pid, pt in spec["points"].items():
        if pid not in data:
            problems.append(f"{pid}: not in the JSON")
            continue
        value = data[pid]["measured"]["throughput"]["value"]
        if abs(float(value) - pt["published"]) > 1e-9:
            problems.append(f"{pid}: JSON says {value}, YAML {pt['published']}")
    for group in spec.get("not_compared", []):
        problems += [f"{pid}: listed as not compared but not in the JSON" for pid in group["ids"] if pid not in data]
    return problems


def summary(rows: list[dict]) -> dict:
    ratio = [r for r in rows if "ratio_within" in r]
    order = [r for r in rows if r["order_checked"]]
    bound = [r for r in rows if r.get("bound")]
    return {"ratio_n": len(ratio), "ratio_ok": sum(r["ratio_ok"] for r in ratio),
            "order_n": len(order), "order_ok": sum(r["order_ok"] for r in order),
            "bound_n": len(bound), "bound_ok": sum(r["bound_ok"] for r in bound)}


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def report_section(spec: dict, rows: list[dict], copies: list[str], amort: list[tuple[str, float]]) -> list[str]:
    """The markdown lines of this benchmark (a section of reports/throughput_vs_published.md)."""
    s = summary(rows)
    k = constants()
    d = spec["dataset_lengths"]
    L = ["## ms-swift one-change ablations", "",
         "From `published_runs/ms_swift_benchmark.json` (A100, Qwen-7B/14B-Chat, LoRA r8 on c_attn, checkpointing, "
         "flash-attention, batch 1 x 16 accumulation unless changed), expressed in "
         "`benchmarks/ms_swift_ablations.yaml` "
         "and computed by `benchmarks/ms_swift_ablations.py`. ms-swift timed samples/s of one dataset, so a ratio of "
         "two "
         "speeds in one table is a throughput ratio. Samples are not padded to the maximum length: each point is "
         f"predicted over a modelled length profile ({' '.join(str(d['shape']).split())}; published: mean {d['mean']}, "
         f"std {d['std']}), January's runs keeping the samples of at most max length, December's cutting them to it; "
         "a micro-batch is padded to its longest sample.", "",
         f"- QLoRA/LoRA speed ratio within 15% of the published one: **{s['ratio_ok']} of {s['ratio_n']}** "
         f"(the fitted constant `dequant_4bit_bandwidth_efficiency` = {k['dequant_4bit_bandwidth_efficiency']:g}).",
         f"- Order kept where the published gap is over {GAP:.0%}: **{s['order_ok']} of {s['order_n']}**.",
         f"- December's wall-time ratios (setup time included, so an upper bound of the training ratio) not "
         f"exceeded: {s['bound_ok']} of {s['bound_n']}.", ""]
    if copies:
        L += ["Data check: " + "; ".join(copies), ""]
    L += ["| a → b | changed | published ratio b/a | predicted ratio | predicted samples/s a → b | "
          "mean tokens (padded) a → b | verdict |", "|---|---|---:|---:|---|---|---|"]
    for r in rows:
        pa, pb = r["pred_a"], r["pred_b"]
        verdict = []
        if "ratio_within" in r:
            verdict.append(f"ratio {_pct(r['ratio_error'])} ({'within' if r['ratio_ok'] else 'OUTSIDE'} "
                           f"{r['ratio_within']:.0%})")
        if r.get("bound"):
            verdict.append("under the bound" if r["bound_ok"] else "ABOVE THE BOUND")
        elif r["order_checked"]:
            verdict.append("order kept" if r["order_ok"] else "ORDER WRONG")
        else:
            verdict.append(f"gap {abs(r['published'] - 1):.0%} <= {GAP:.0%}: order not required "
                           f"({'kept' if r['same_order'] else 'differs'})")
        L.append(f"| {r['a']} → {r['b']} | {r['changed']} | {r['published']:.3f} | {r['predicted']:.3f} | "
                 f"{pa['samples_per_s']:.2f} → {pb['samples_per_s']:.2f} | "
                 f"{pa['mean_tokens']:.0f} ({pa['padded']:.0f}) → "
                 f"{pb['mean_tokens']:.0f} ({pb['padded']:.0f}) | {'; '.join(verdict)} |")
    L += ["", "Samples/s themselves are not compared: the modelled lengths set them, and ms-swift's Qwen remote code "
          "(flash-attn's fused rotary and RMSNorm where built) is not the stack the advisor models.", "",
          "### QLoRA's dequantization, amortized over a micro-batch's tokens", "",
          "bitsandbytes dequantizes every 4-bit weight once per pass whatever the micro-batch holds (autograd "
          "`MatMul4Bit`: forward through `gemm_4bit`, which for more than 1,536 rows is `dequantize_4bit` + "
          "`F.linear`; backward `F.dequantize_4bit(B, ctx.state)` before its matmul; checkpointing dequantizes "
          "once more in the recomputed forward). The term is the bytes of those passes (packed read, absmax, the "
          "compute-dtype write) at `dequant_4bit_bandwidth_efficiency` of the datasheet bandwidth, fitted on the "
          "two January pairs above. The fit is a tenth of a streaming kernel's 0.8: in these runs "
          "(bitsandbytes 0.41.3) the cost per micro-batch is about ten times what the bytes alone explain. Its "
          "source is not isolated here; bitsandbytes' own later rewrites of the kernel report 1.4-2.1x faster 4-bit "
          "dequantization on the A100 (PRs #1746, #1747, 2025), so today's cost may be lower than fitted.", "",
          "Predicted QLoRA/LoRA ratio of the same Qwen-7B plan at uniform lengths (no padding):", "",
          "| micro-batch x tokens | predicted QLoRA/LoRA |", "|---|---:|"]
    L += [f"| {shape} | {ratio:.3f} |" for shape, ratio in amort]
    L += ["", "Published points where the two ran at near-equal speed (other stacks, not scored): "
          + "; ".join(f"{name}: {desc}: {ratio:.3f}" for name, desc, ratio in NEAR_EQUAL) + ".", "",
          "Left out of this comparison:", ""]
    for group in spec.get("not_compared", []):
        L.append(f"- {', '.join(group['ids'])}: {group['why']}.")
    return L


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="grid-fit dequant_4bit_bandwidth_efficiency and print it")
    args = ap.parse_args(argv)
    spec = load_spec()
    if args.fit:
        eff, obj, rows = fit(spec)
        print(f"best dequant_4bit_bandwidth_efficiency {eff} (mean |log error| {obj:.4f})")
        for r in rows:
            print(f"  {r['a']} -> {r['b']}: published {r['published']:.3f}, predicted {r['predicted']:.3f} "
                  f"({_pct(r['ratio_error'])})")
        return 0
    rows = evaluate(spec)
    for r in rows:
        print(f"{r['changed']:45s} published {r['published']:.3f} predicted {r['predicted']:.3f}")
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
