"""Predicted vs published GPU memory of GRPO / DPO runs, each on the point's own counter.

Every point of ``../shared/published_runs/rl_runs.json`` (grades A/B/C, each naming its counter) is listed. A point
whose run the advisor expresses (TRL's GRPOTrainer / DPOTrainer with peft and bitsandbytes, or vLLM's pool as vLLM
accounts it) gets the advisor's prediction of the part of memory the point measures:

| the point's counter | the advisor's figure |
|---|---|
| nvidia-smi, a "VRAM" column, or unstated | the run's peak phase: reserved bytes + CUDA context (peak_bytes) |
| vLLM's memory-profile log at engine init | vLLM's pool (gpu_memory_utilization x total), its weights and KV cache |
| "it ran" / "OOM" | whether the run's peak fits the card |

Other stacks are predicted as TRL would run the same configuration where that is meaningful, and the report names
what the stack does differently instead of fitting to it: Unsloth shares one weight copy between vLLM and the
trainer (fast_inference) and offloads activations; verl and ms-swift use FSDP / DeepSpeed / Megatron with parameter
and optimizer offload and their own rollout workers; Liger's benchmark is the loss head alone.

Run: python benchmarks/rl_vs_published.py [--out reports/rl_vs_published.md]   (the closed form: seconds)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = Path("/work/shared/published_runs/rl_runs.json")
GiB = 2**30
GB = 10**9

# The points the advisor expresses: the TRL-equivalent plan (advisor Plan fields), the card(s), and the counter.
QLORA = dict(method="qlora", quantization="nf4", double_quant=True)
EXPRESSED = {
    "trl-nb-grpo-table-best": dict(
        model="qwen2-7b-instruct", gpus={"T4": "t4", "A100-40GB": "a100-40gb", "A100-80GB": "a100-80gb"},
        plan=dict(task="grpo", **QLORA, lora_r=32, lora_alpha=32.0, lora_targets="all-linear", precision="fp16",
                  compute_dtype="fp16", gradient_checkpointing=True, optimizer="paged_adamw_8bit", micro_batch=8,
                  grad_accum=1, num_generations=8, max_prompt_length=256, max_completion_length=256,
                  generation="transformers", beta=0.0),
        counter="nvidia-smi", unit=GB,
        assumed="prompt 256 tokens (not stated); the table's model is the notebook's default"),
    "trl-nb-grpo-table-naive-fp16": dict(
        model="qwen2-7b-instruct", gpus={"": "a100-80gb"},
        plan=dict(task="grpo", method="full", precision="mixed_fp16", compute_dtype="fp16", attn_impl="eager",
                  gradient_checkpointing=False, optimizer="adamw_torch", micro_batch=8, grad_accum=1,
                  num_generations=8, max_prompt_length=256, max_completion_length=256, generation="transformers",
                  beta=0.0),
        counter="nvidia-smi", unit=GB,
        assumed="mixed fp16 (fp32 masters) for 'fp16' full training; prompt 256 tokens. A full 7B fine-tune with "
                "AdamW holds 16 B/param (122 GB) before activations, so 62 GB cannot be this configuration (grade C: "
                "the table's model or optimizer is not what it says)"),
    "trl-3456-grpo-qwen3-nvidia-smi": dict(
        model="qwen3-0.6b", gpus={"Qwen3-0.6B": "a100-80gb"},
        plan=dict(task="grpo", method="full", precision="mixed_bf16", compute_dtype="bf16",
                  gradient_checkpointing=False, optimizer="adamw_torch", micro_batch=4, grad_accum=1,
                  num_generations=4, max_prompt_length=2500, max_completion_length=1024, generation="transformers",
                  beta=0.0),
        counter="nvidia-smi", unit=2**20,
        assumed="num_generations 4 (not stated; TRL needs the batch of 4 to hold whole groups); the longest prompt "
                "~2,500 tokens; fp32 weights (no torch_dtype) with bf16 autocast"),
    "unsloth-nb-grpo-mistral-7b-qlora-4090": dict(
        model="mistral-7b-v0.3", gpus={"": "rtx-4090"},
        plan=dict(task="grpo", **QLORA, lora_r=32, lora_alpha=32.0, lora_targets="all-linear", precision="bf16",
                  compute_dtype="bf16", gradient_checkpointing=True, optimizer="paged_adamw_8bit", micro_batch=6,
                  grad_accum=1, num_generations=6, max_prompt_length=256, max_completion_length=768,
                  generation="vllm-colocate", vllm_gpu_memory_utilization=0.5893, beta=0.0),
        counter="vllm-pool", unit=GiB, assumed="the effective utilization 0.5893 Unsloth logs"),
    "unsloth-nb-grpo-qwen25-3b-qlora-t4": dict(
        model="qwen2.5-3b-instruct", gpus={"": "t4"},
        plan=dict(task="grpo", **QLORA, lora_r=64, lora_alpha=64.0, lora_targets="all-linear", precision="fp16",
                  compute_dtype="fp16", gradient_checkpointing=True, optimizer="adamw_8bit", micro_batch=8,
                  grad_accum=1, num_generations=8, max_prompt_length=256, max_completion_length=200,
                  generation="vllm-colocate", vllm_gpu_memory_utilization=0.5, beta=0.0),
        counter="vllm-pool", unit=GiB, assumed="utilization from the point's vllm entry (0.5 when not given)"),
    "trl-5200-dpo-qwen25-0.5b-qlora-17gb": dict(
        model="qwen2.5-0.5b-instruct", gpus={"": "a100-80gb"},
        plan=dict(task="dpo", **QLORA, lora_r=64, lora_alpha=32.0, lora_dropout=0.1, lora_targets="all-linear",
                  precision="fp16", compute_dtype="fp16", gradient_checkpointing=True, optimizer="adamw_torch",
                  micro_batch=8, grad_accum=1, seq_len=1024, beta=0.1),
        counter="unstated", unit=GB,
        assumed="batch 8 (DPOConfig default), ~1,000-token prompts padded to 1,024; GPU not stated (an 80 GB card). "
                "TRL 0.12 computed the full logits of chosen and rejected (16 x 1,024 x 151,936 vocabulary, fp32 for "
                "the log-softmax: about 10 GB alone); TRL 1.16 scores through its fused log-prob head, which the "
                "advisor models: the gap is the releases', not fitted"),
    "llamafactory-3716-dpo-llama3-8b-lora-a10": dict(
        model="llama-3.1-8b-instruct", gpus={"": "a10g"},
        plan=dict(task="dpo", method="lora", lora_r=8, lora_alpha=16.0, lora_targets=("q_proj", "v_proj"),
                  precision="fp16", compute_dtype="fp16", gradient_checkpointing=True, optimizer="adamw_torch",
                  micro_batch=4, grad_accum=8, seq_len=1024, beta=0.1),
        counter="ran", unit=GB, assumed="Llama-3.1-8B's shapes for Llama-3-8B; A10G (24 GB) for the A10"),
    "unsloth-nb-dpo-zephyr-7b-qlora-t4": dict(
        model="mistral-7b-v0.3", gpus={"": "t4"},
        plan=dict(task="dpo", **QLORA, lora_r=64, lora_alpha=64.0, lora_targets="all-linear", precision="fp16",
                  compute_dtype="fp16", gradient_checkpointing=True, optimizer="adamw_8bit", micro_batch=2,
                  grad_accum=4, seq_len=1024, beta=0.1),
        counter="ran", unit=GB, assumed="Mistral-7B-v0.3's shapes for Zephyr-7B (Mistral-7B-v0.1: vocab 32,000)"),
    "trl-3168-dpo-qwen25-0.5b-full-oom-a100": dict(
        model="qwen2.5-0.5b-instruct", gpus={"": "a100-80gb"},
        plan=dict(task="dpo", method="full", precision="fp32", compute_dtype="fp32", gradient_checkpointing=False,
                  optimizer="adamw_torch", micro_batch=8, grad_accum=1, seq_len=1024, beta=0.1, reference="copy"),
        counter="oom", unit=GB,
        assumed="batch 8 and max_length 1,024 (that release's defaults); the advisor models TRL 1.16's fused "
                "log-prob head, the release OOMed on full fp32 logits (16 x 1,024 x 151,936 x 4 B = 10 GB, several "
                "copies through log_softmax and backward) and a reference copy: under TRL 1.16 it would fit"),
}


def stack_difference(point: dict) -> str:
    """What the point's stack does differently from TRL + peft + bitsandbytes (+ vLLM)."""
    s = point["stack"].lower()
    if "unsloth" in s:
        return ("Unsloth shares one weight copy between vLLM and the trainer (fast_inference: the trainer's LoRA "
                "runs on vLLM's weights) and offloads checkpointed activations; TRL loads vLLM's own copy")
    if "verl" in s:
        return ("verl: an FSDP actor with parameter and optimizer offload, its own vLLM/SGLang rollout workers in a "
                "hybrid engine that frees the trainer's memory while rolling out")
    if "swift" in s:
        return ("ms-swift: DeepSpeed ZeRO / Megatron with its own rollout workers (vLLM / LMDeploy), offload and "
                "packing; its memory(GiB) log is its own counter")
    if "liger" in s and "benchmark" in s:
        return "Liger's benchmark is the LM head + loss alone (no model): a kernel figure, not a run's"
    if "nemo" in s or "openrlhf" in s or "sglang" in s or "simple_grpo" in s or "vlm-grpo" in s:
        return "its own trainer and rollout engine (Megatron / Ray / DeepSpeed / SGLang), not TRL's"
    if "llama-factory" in s or "llamafactory" in s:
        return "LLaMA-Factory on TRL's trainer (its defaults: checkpointing on)"
    return "TRL"


def predict(spec: dict, gpu_key: str):
    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.core.plan import Plan
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    model, gpu = resolve_model(spec["model"]), resolve_gpu(gpu_key)
    plan = Plan(**spec["plan"])
    problems = plan.problems()
    if problems:
        return None, f"the plan breaks a rule: {problems[0].rule}"
    report = with_phases(model, plan, gpu, get_backend("estimate").measure(model, plan, gpu))
    return (model, gpu, plan, report), ""


def published_values(point: dict) -> dict[str, object]:
    v = (point.get("memory") or {}).get("value")
    return v if isinstance(v, dict) else {"": v}


def row_for(point: dict, spec: dict) -> list[str]:
    out = []
    values = published_values(point)
    unit = spec["unit"]
    uname = {GB: "GB", GiB: "GiB", 2**20: "MiB"}[unit]
    for label, gpu_key in spec["gpus"].items():
        got, why = predict(spec, gpu_key)
        pub = values.get(label, values.get(""))
        if got is None:
            out.append(f"| {point['id']}{' ' + label if label else ''} | {point['grade']} | {pub} | - | {why} |")
            continue
        model, gpu, plan, rep = got
        peak = rep.run_peak_bytes
        phase = rep.run_peak_phase
        if spec["counter"] == "vllm-pool":
            g = rep.extra.get("generation") or {}
            bd = point["memory"].get("breakdown", {})
            pred = (f"pool {g.get('pool_bytes', 0) / unit:.2f}, weights {g.get('weights_bytes', 0) / unit:.2f}, "
                    f"KV {g.get('kv_cache_bytes', 0) / unit:.2f} {uname}")
            pubt = (f"{pub} {uname}" + (f" (weights {bd.get('vllm_model_weights')}, KV {bd.get('kv_cache')})"
                                        if bd else ""))
            ratio = g.get("pool_bytes", 0) / unit / float(pub) if pub else None
            out.append(f"| {point['id']} | {point['grade']} | {pubt} | {pred} (vLLM's pool, as vLLM accounts it) | "
                       f"{'' if ratio is None else f'pool {ratio:.2f}x; '}run peak {peak / unit:.2f} {uname} in "
                       f"{phase}: TRL holds vLLM's own copy beside the trainer's |")
        elif spec["counter"] in ("ran", "oom"):
            fits = peak <= gpu.memory_bytes
            want = spec["counter"] == "ran"
            verdict = "agrees" if fits == want else "disagrees"
            out.append(f"| {point['id']} | {point['grade']} | {'ran' if want else 'OOM'} on {gpu.name} | run peak "
                       f"{peak / unit:.2f} {uname} in {phase}: {'fits' if fits else 'does not fit'} | {verdict} |")
        else:
            pubv = float(pub) if isinstance(pub, (int, float)) else None
            ratio = f"{peak / unit / pubv:.2f}x" if pubv else "-"
            out.append(f"| {point['id']}{' ' + label if label else ''} | {point['grade']} | {pub} {uname} "
                       f"({spec['counter']}) | {peak / unit:.2f} {uname}, peak phase {phase} (reserved + context) | "
                       f"{ratio} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "rl_vs_published.md"))
    args = ap.parse_args(argv)
    d = json.loads(DATA.read_text())
    points = d["points"]
    lines = ["# GRPO / DPO memory: the advisor against published runs", "",
             f"`python benchmarks/rl_vs_published.py` over `{DATA}` ({len(points)} points; grades A measured with the "
             "configuration stated, B measured with a detail inferred, C a claim or ambiguous). Each point is compared "
             "on "
             "its own counter; the advisor is the closed form (advisor/memory/rl.py) of TRL 1.16's trainers with peft, "
             "bitsandbytes and vLLM. Nothing is fitted to another stack: where a stack does something TRL does not, "
             "the difference is named.", "",
             "## Compared (the advisor's figure for the part of memory the point measures)", "",
             "| point | grade | published (counter) | advisor | note |", "|---|---|---|---|---|"]
    notes = []
    for p in points:
        spec = EXPRESSED.get(p["id"])
        if spec is None:
            continue
        lines += row_for(p, spec)
        notes.append(f"- `{p['id']}` ({p['stack']}): {spec['assumed']}. {stack_difference(p)}.")
    lines += ["", "Assumptions and stacks of the compared points:", "", *notes, "",
              "## Not compared: what each stack does differently", "",
              "| point | grade | algorithm | stack | counter | why not |", "|---|---|---|---|---|---|"]
    for p in points:
        if p["id"] in EXPRESSED:
            continue
        counter = ((p.get("memory") or {}).get("counter") or "not stated").replace("|", "/")[:80]
        algo = p["algorithm"]
        why = stack_difference(p)
        if algo not in ("grpo", "dpo"):
            why = f"{algo}: not a task the advisor plans (grpo, dpo); " + why
        elif (p.get("memory") or {}).get("value") is None:
            why = "no memory figure published (a batch limit, a time, or 'not published'); " + why
        lines.append(f"| {p['id']} | {p['grade']} | {algo} | {p['stack'][:60].replace('|', '/')} | {counter} | {why} |")
    lines += ["", "## Reading it", "",
              "- The nvidia-smi / VRAM figures include the CUDA context and the allocator's cache: the advisor's "
              "peak_bytes is the same quantity (reserved + context) of the run's highest phase.",
              "- vLLM's pool is gpu_memory_utilization x the card's total by construction; its split (weights, "
              "activations, KV) is where the advisor and vLLM's own log can differ.",
              "- Unsloth's colocated runs hold one weight copy: the trainer's LoRA runs over vLLM's weights. TRL's "
              "colocate mode loads vLLM's own copy beside the trainer's, so the advisor's TRL run peak is higher by "
              "about one copy of the weights in vLLM's format; that is the stacks' difference, not an error to fit.",
              "- verl / ms-swift / NeMo RL runs shard and offload the actor (FSDP, ZeRO-3, Megatron) and free it "
              "while rolling out: the advisor does not plan those stacks."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
