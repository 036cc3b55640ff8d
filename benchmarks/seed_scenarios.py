"""The seeds' Qwen2.5-7B scenarios through the advisor's ledger, beside the seeds' own figures.

    python benchmarks/seed_scenarios.py [--backend estimate|simulate] [--markdown]

Scenarios follow the second seed's table (RTX 4090, batch 1, seq 1024; QLoRA: nf4, double
quantization, r 16 / alpha 32 on q,k,v,o, paged_adamw_8bit, gradient checkpointing).
"""

from __future__ import annotations

import argparse
import time

from advisor.runtime.backends import available, get_backend
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan

GiB = 2**30
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
SCENARIOS = [
    ("Full FP32 + AdamW", "~120 GB (weights 28 GB)",
     Plan(method="full", precision="fp32", optimizer="adamw_torch", gradient_checkpointing=True)),
    ("Full mixed BF16 (fp32 masters) + AdamW", "~120 GB (14 + 14 + 84 + 10)",
     Plan(method="full", precision="mixed_bf16", optimizer="adamw_torch", gradient_checkpointing=True)),
    ("Full BF16 + AdamW (bf16 states)", "~60 GB (weights 14 GB)",
     Plan(method="full", precision="bf16", optimizer="adamw_torch", gradient_checkpointing=True)),
    ("LoRA BF16 r16 q,k,v,o", "~31-35 GB",
     Plan(method="lora", lora_targets=QKVO, optimizer="adamw_torch")),
    ("LoRA BF16 r16 q,k,v,o + checkpointing", "(not given)",
     Plan(method="lora", lora_targets=QKVO, optimizer="adamw_torch", gradient_checkpointing=True)),
    ("QLoRA NF4 (seeds' recipe)", "~14-17 GB (weights 4-5 GB)",
     Plan(method="qlora", quantization="nf4", double_quant=True, lora_targets=QKVO, optimizer="paged_adamw_8bit",
          gradient_checkpointing=True, grad_accum=8)),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="estimate", choices=available())
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    model = resolve_model("qwen7b")
    gpu = resolve_gpu("rtx-4090")
    measure = get_backend(args.backend)
    rows = []
    for name, seed_says, plan in SCENARIOS:
        t = time.perf_counter()
        r = measure(model, plan, gpu)
        secs = time.perf_counter() - t
        d = r.device
        rows.append((name, seed_says, d["weights"] / GiB, (d["gradients"]) / GiB,
                     (d["optimizer_states"] + d["master_weights"]) / GiB, d["activations"] / GiB,
                     d["transient"] / GiB, r.tensor_peak_bytes / GiB, r.peak_bytes / GiB, r.peak_phase, secs))
    head = ("scenario", "seeds say", "weights", "grads", "optimizer", "activations", "transient", "tensor peak",
            "peak (+overhead)", "peak during", "seconds")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join([row[0], row[1], *(f"{v:.1f}" for v in row[2:9]), row[9], f"{row[10]:.2f}"]) + " |")
    else:
        for row in rows:
            print(row[0], "|", row[1], "|", " ".join(f"{v:.1f}" for v in row[2:9]), row[9])
    print(f"\nbackend: {args.backend}; GiB; model {model.name} ({model.params_total:,} parameters); GPU overheads of "
          f"{gpu.name}")


if __name__ == "__main__":
    main()
