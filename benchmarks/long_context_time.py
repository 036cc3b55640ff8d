"""Where a long-context step's time goes, at 8K, 32K and 128K tokens: the step-time model's terms (advisor.speed),
per plan, beside the closed form's peak of one GPU.

The attention term grows with the square of the length while the matmuls grow with it; sequence parallelism adds
its exchange (Ulysses' all-to-alls, ring attention's k/v gathers) and divides everything else; checkpoint offload
adds its host-link transfers. These are predictions (no GPU here), each term cited in advisor/speed/terms.py.

Run: python benchmarks/long_context_time.py [--out reports/long_context_time.md]   (seconds)
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.core.catalog import resolve_gpu, resolve_model  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.memory.rl import step_ledger  # noqa: E402
from advisor.memory.sharding import shard_report  # noqa: E402
from advisor.speed.throughput import predict_throughput, term_labels  # noqa: E402

LENGTHS = (8192, 32768, 131072)
GiB = 2**30
FULL = dict(method="full", precision="bf16", optimizer="adamw_torch", gradient_checkpointing=True,
            loss="fused-linear", attn_impl="flash_attention_3")
CASES = [
    # (title, model, gpu, gpus, sharding, plan)
    ("Llama-3.1-8B full, 1 x H200, ZeRO-3 offload, FA3, fused loss", "meta-llama/Llama-3.1-8B-Instruct", "h200", 1,
     "zero3", Plan(offload="zero3_cpu", **FULL)),
    ("... with checkpoint offload", "meta-llama/Llama-3.1-8B-Instruct", "h200", 1, "zero3",
     Plan(offload="zero3_cpu", activation_offload=True, **FULL)),
    ("... 8 x H200, Ulysses SP 8, ZeRO-3", "meta-llama/Llama-3.1-8B-Instruct", "h200", 8, "zero3",
     Plan(sp_degree=8, **FULL)),
    ("... 8 x H200, ring attention 8, FSDP, sdpa", "meta-llama/Llama-3.1-8B-Instruct", "h200", 8, "fsdp",
     Plan(sp_degree=8, sp_backend="ring", **{**FULL, "attn_impl": "sdpa"})),
    ("Llama-3.1-8B QLoRA, 1 x RTX 4090, FA2, fused loss", "meta-llama/Llama-3.1-8B-Instruct", "rtx-4090", 1, "zero3",
     Plan(method="qlora", quantization="nf4", double_quant=True, gradient_checkpointing=True, loss="fused-linear",
          attn_impl="flash_attention_2")),
]
SHOWN = 5  # terms per row


def rows(case) -> list[str]:
    title, name, gpu_key, gpus, sharding, plan = case
    model, gpu = resolve_model(name), resolve_gpu(gpu_key)
    labels = term_labels()
    shown = plan.short().replace(f" s{plan.seq_len}", "")  # the length is each row's
    out = [f"### {title}", "", f"`{shown}` on {gpus} x {gpu.name}", "",
           "| tokens | step (s) | tokens/s (all GPUs) | peak / GPU (GiB) | where the time goes (share of the step) |",
           "|---:|---:|---:|---:|---|"]
    for n in LENGTHS:
        p = plan.with_(seq_len=n)
        tp = predict_throughput(model, p, gpu, gpus, sharding)
        rep = step_ledger(model, p, gpu)
        if gpus > 1:
            rep = shard_report(rep, model, p, gpus, sharding, gpu)
        shares = ", ".join(f"{labels.get(k, k)} {v / tp.step_seconds:.0%}" for k, v in tp.largest_terms(SHOWN))
        out.append(f"| {n:,} | {tp.step_seconds:.2f} | {tp.tokens_per_s:,.0f} | {rep.peak_bytes / GiB:.1f} | "
                   f"{shares} |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "long_context_time.md")
    args = ap.parse_args(argv)
    lines = ["# Where a long-context step's time goes (predicted)", "",
             f"Written by `python benchmarks/long_context_time.py` on {dt.date.today()}: the step-time model's terms "
             "(advisor/speed/terms.py) and the closed form's peak of one GPU, at 8K, 32K and 128K tokens per "
             "sequence (micro-batch 1). Predictions: no GPU measured these.", ""]
    for case in CASES:
        lines += rows(case)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
