"""Simulated vs analytic peak memory, and what the peers a user would otherwise consult say.

For each plan of a matrix: the simulated tensor peak (--backend simulate), the analytic one
(--backend estimate), the analytic error, the simulation's seconds, and beside them
- accelerate's `estimate-memory` (its Python API: `calculate_maximum_sizes` on the model built
  from its config on the meta device, then `estimate_training_usage` for bf16 training with Adam,
  the number its CLI prints as "Training using Adam (Peak vRAM)": max of its four parts);
- DeepSpeed's `estimate_zero2_model_states_mem_needs_all_cold` / `..._zero3_..._all_cold` (one
  GPU, the GPU column for the plan's offload setting; model states only, every parameter trained).

Peers answer another question (model states only, no activations, no LoRA/QLoRA, no checkpointing);
the table shows how far that answer is from the step a person will run.

Run: python benchmarks/simulate_vs_peers.py [--out reports/simulate_accuracy.md] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import sys
import time

GIB = 2**30

MATRIX = [
    ("qwen2.5-0.5b-instruct", dict(method="full", seq_len=1024)),
    ("qwen2.5-0.5b-instruct", dict(method="lora", seq_len=2048, gradient_checkpointing=True)),
    ("qwen2.5-7b-instruct", dict(method="lora", seq_len=1024, gradient_checkpointing=True)),
    ("qwen2.5-7b-instruct", dict(method="lora", seq_len=1024)),
    ("qwen2.5-7b-instruct", dict(method="qlora", quantization="nf4", double_quant=True, seq_len=2048,
                                 gradient_checkpointing=True, optimizer="paged_adamw_8bit")),
    ("qwen2.5-7b-instruct", dict(method="full", seq_len=1024, gradient_checkpointing=True)),
    ("qwen2.5-7b-instruct", dict(method="full", seq_len=1024, gradient_checkpointing=True, offload="zero2_cpu")),
    ("llama-3.1-8b-instruct", dict(method="qlora", quantization="nf4", seq_len=4096, gradient_checkpointing=True,
                                   lora_targets="all-linear")),
    ("qwen3-14b", dict(method="lora", quantization="int8", seq_len=1024, gradient_checkpointing=True,
                       optimizer="adamw_8bit")),
    ("mistral-7b-v0.3", dict(method="lora", seq_len=2048, micro_batch=2, optimizer="adafactor")),
    ("llama-3.1-70b-instruct", dict(method="qlora", quantization="nf4", double_quant=True, seq_len=1024,
                                    gradient_checkpointing=True)),
]


def accelerate_peak(spec) -> int:
    """accelerate estimate-memory's "Training using Adam (Peak vRAM)" for bfloat16, without a download."""
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import calculate_maximum_sizes, estimate_training_usage
    from transformers import AutoModelForCausalLM

    from advisor.core.catalog import build_hf_config

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(build_hf_config(spec.config), dtype="float32")
    total, _largest = calculate_maximum_sizes(model)
    return int(max(estimate_training_usage(total, "bfloat16").values()))


def deepspeed_gpu(spec, plan) -> tuple[int, int]:
    """(ZeRO-2, ZeRO-3) GPU bytes for one GPU, offload as the plan says; the _all_cold tables are run too."""
    from deepspeed.runtime.zero.stage3 import (estimate_zero3_model_states_mem_needs,
                                               estimate_zero3_model_states_mem_needs_all_cold)
    from deepspeed.runtime.zero.stage_1_and_2 import (estimate_zero2_model_states_mem_needs,
                                                      estimate_zero2_model_states_mem_needs_all_cold)

    largest = max(spec.embedding_params, spec.layer_params())
    with contextlib.redirect_stdout(io.StringIO()):  # the _all_cold functions print every offload combination
        estimate_zero2_model_states_mem_needs_all_cold(spec.params_total, num_gpus_per_node=1, num_nodes=1)
        estimate_zero3_model_states_mem_needs_all_cold(spec.params_total, largest, num_gpus_per_node=1, num_nodes=1)
    offload = plan.offload != "none"
    _, z2 = estimate_zero2_model_states_mem_needs(spec.params_total, 1, 1, cpu_offload=offload)
    _, z3, _ = estimate_zero3_model_states_mem_needs(spec.params_total, largest, 1, 1, cpu_offload=offload,
                                                     cpu_offload_params=plan.offload == "zero3_cpu")
    return z2, z3


def run(rows, out: str | None) -> str:
    from advisor.memory.training import estimate_training
    from advisor.runtime.backends import get_backend
    from advisor.core.catalog import resolve_model
    from advisor.core.plan import Plan

    simulate = get_backend("simulate")
    lines = ["| model | plan | simulated GiB | analytic GiB | analytic error | sim s | accelerate GiB | "
             "DS ZeRO-2 GPU GiB | DS ZeRO-3 GPU GiB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    errors = []
    for name, fields in rows:
        spec, plan = resolve_model(name), Plan(**fields)
        t = time.perf_counter()
        sim = simulate(spec, plan)
        seconds = time.perf_counter() - t
        est = estimate_training(spec, plan)
        err = (est.tensor_peak_bytes - sim.tensor_peak_bytes) / sim.tensor_peak_bytes
        errors.append(abs(err))
        acc = accelerate_peak(spec)
        z2, z3 = deepspeed_gpu(spec, plan)
        row = (f"| {name} | {plan.short()} | {sim.tensor_peak_bytes / GIB:.2f} | {est.tensor_peak_bytes / GIB:.2f} | "
               f"{err:+.2%} | {seconds:.1f} | {acc / GIB:.2f} | {z2 / GIB:.2f} | {z3 / GIB:.2f} |")
        print(row, flush=True)
        lines.append(row)
    import torch

    head = [
        "# Simulated vs analytic vs peers: tensor peak of one training step",
        "",
        "Generated by `python benchmarks/simulate_vs_peers.py` on "
        f"{platform.machine()} ({platform.processor() or 'cpu'}), torch {torch.__version__}, "
        f"python {platform.python_version()}. Bytes are live tensors at the step's peak (GiB = 2^30), before "
        "CUDA context / allocator overhead. 'sim s' is the in-process simulation time (imports warm).",
        "",
        "Peers: accelerate = `estimate-memory`'s 'Training using Adam (Peak vRAM)' for bfloat16 (model "
        "states only, full fine-tuning); DeepSpeed = `estimate_zero{2,3}_model_states_mem_needs` GPU column "
        "(one GPU, the plan's offload), the numbers its `_all_cold` tables print. Neither sees activations, "
        "logits, LoRA, quantization or checkpointing.",
        "",
    ]
    tail = ["", f"Analytic vs simulated: max |error| {max(errors):.2%}, mean {sum(errors) / len(errors):.2%} "
                f"over {len(errors)} plans."]
    text = "\n".join(head + lines + tail) + "\n"
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the Markdown table here (e.g. reports/simulate_accuracy.md)")
    p.add_argument("--quick", action="store_true", help="the first three plans only")
    args = p.parse_args(argv)
    run(MATRIX[:3] if args.quick else MATRIX, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
