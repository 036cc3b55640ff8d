"""Predicted vs published GPU memory and longest trainable length of long-context fine-tuning runs.

Every point of ``../shared/published_runs/vlm_longctx_runs.json`` (its ``long_context`` list; grades A/B/C) is listed.
A point whose run the advisor expresses (transformers' Trainer + peft + bitsandbytes + DeepSpeed; sequence parallelism
by --sp-degree: Ulysses, ring) is predicted by the closed form on the point's own counter, as
benchmarks/memory_vs_published.py reads counters (its ``Case``, ``train_phases`` and ``counter_peak``, which maps a
counter to a phase's bytes through its ``COUNTER_FIELD``, are imported, not copied):

| the point's counter | the advisor's figure |
|---|---|
| a figure, counter not stated ("12 GB") | the peak phase (load, train): nvidia-smi (reserved + CUDA context) |
| an ms-swift script comment ("4 * 42GB": max_memory_reserved or nvidia-smi) | the peak phase's reserved bytes |
| "the longest that fit" / "OOM at N" (a bound) | ``max_seq_len``: the longest length whose run fits the card |

A bound holds when the advisor's ``max_seq_len`` is at least the published length that fit and below the length the
source saw OOM (where it gives one), or not far above the published length (at most ``NEAR`` times it) where it
gives none. Megatron, Unsloth's kernels, tiled MLP, ms-swift's combined Ulysses x ring, EasyContext and 360-LLaMA-
Factory's zigzag ring DPO are not modelled by the advisor: those points are listed with what differs, never fitted; a
few get the nearest plain plan "for reference only".

Models the catalog lacks (Llama-2-7B, Meta-Llama-3-8B) take memory_vs_published's ``ARCH`` (each hub config.json).

Run: python benchmarks/long_context_vs_published.py [--out reports/long_context_vs_published.md]   (seconds)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # memory_vs_published beside this script

from memory_vs_published import LOAD_TRAIN, Case, Models, counter_peak, train_phases  # noqa: E402

DATA = Path("/work/shared/published_runs/vlm_longctx_runs.json")
GiB = 2**30
GB = 10**9
UNITS = {"GiB": GiB, "GB": GB, "G": GB}
NEAR = 1.25
"""A bound with no OOM length above it holds when max_seq_len is at most this many times the published length."""

# ---- the plans -------------------------------------------------------------------------------------------------
# LLaMA-Factory (April 2024) wiki benchmark: QLoRA 4-bit (double quantization on: its default), r8 all modules,
# dropout 0, batch 1 x 4, checkpointing on (its default), FlashAttention-2, bf16 compute on an A100.
LF_QLORA = dict(method="qlora", quantization="nf4", double_quant=True, lora_r=8, lora_alpha=16.0, lora_dropout=0.0,
                lora_targets="all-linear", micro_batch=1, grad_accum=4, gradient_checkpointing=True,
                attn_impl="flash_attention_2", optimizer="adamw_torch")
# Unsloth's README / blog tables, the "Hugging Face + FA2" column: 4-bit QLoRA on all linear layers, rank 32,
# batch 1, every sequence padded to the length; checkpointing and the optimizer are not stated.
HF_FA2_QLORA = dict(method="qlora", quantization="nf4", lora_r=32, lora_alpha=32.0, lora_dropout=0.0,
                    lora_targets="all-linear", micro_batch=1, gradient_checkpointing=True,
                    attn_impl="flash_attention_2", optimizer="adamw_torch")
FULL = dict(method="full", precision="bf16", optimizer="adamw_torch", gradient_checkpointing=True,
            attn_impl="flash_attention_2", micro_batch=1)
SWIFT = "ms-swift `swift sft` (transformers' Trainer + DeepSpeed)"
HF = "transformers (+ peft, bitsandbytes)"

# The points whose memory figure the advisor predicts: the model (catalog name or memory_vs_published.ARCH key), the
# Plan's fields, the card, the GPUs and their sharding, the counter ("unstated": nvidia-smi; "swift": reserved).
EXPRESSED = {
    "lf-wiki-llama2-7b-qlora-fa2-8192": dict(
        model="llama-2-7b", gpu="a100-40gb", gpus=1, sharding="ddp", counter="unstated",
        stack="LLaMA-Factory (April 2024) on " + HF, plan=dict(LF_QLORA, seq_len=8192),
        assumed="every batch padded to 8192 (padding / packing not stated); checkpointing on (LLaMA-Factory's "
                "default); the figure taken as nvidia-smi; RoPE scaling past Llama-2's 4096 does not change memory"),
    "alst-h200-llama3.1-8b-full-sp1-65k": dict(
        model="llama-3.1-8b-instruct", gpu="h200", gpus=1, sharding="ddp", counter="unstated",
        stack="ArcticTraining (DeepSpeed ZeRO-3, parameters and optimizer offloaded, cpu_adam)",
        plan=dict(FULL, offload="zero3_cpu", packing=True, seq_len=65000),
        assumed="ZeRO-3 with parameters and optimizer on the CPU (the advisor's zero3_cpu) on one GPU; "
                "flash_attention_3 read as flash_attention_2 (the same O(n) memory); packed ultrachat samples; "
                "no Liger (HF's loss); the recipe comment's 'GB' taken as nvidia-smi"),
    "swift-qwen2.5-7b-full-16k-zero3-liger-4x42GB": dict(
        model="qwen2.5-7b-instruct", gpu="a100-80gb", gpus=4, sharding="zero3", counter="swift", stack=SWIFT,
        plan=dict(FULL, packing=True, loss="fused-linear", grad_accum=2, seq_len=16384),
        assumed="Qwen2.5-7B base read as the catalogued Qwen2.5-7B-Instruct (the same architecture); packed to "
                "16384; liger's fused linear cross-entropy (--loss fused-linear; liger's RMSNorm / SwiGLU / RoPE "
                "kernels not modelled); an 80 GB A100 (capacity not stated)"),
    "swift-qwen2.5-7b-full-16k-zero3-liger-4x56GB-superseded": dict(
        model="qwen2.5-7b-instruct", gpu="a100-80gb", gpus=4, sharding="zero3", counter="swift",
        stack="ms-swift 3.3.0.dev0 " + SWIFT[len("ms-swift "):],
        plan=dict(FULL, packing=True, loss="fused-linear", grad_accum=2, seq_len=16384),
        assumed="as the 42 GB row (the same script; this comment was replaced by '4 * 42GB' two releases later)"),
}

# The points that publish the longest length that fit (or the OOM): each bound's plan (its length is searched),
# the budget (the card's memory, or a nominal "N GB" card read as N GiB on the given card's overheads), the
# published length that fit and the shortest length published as OOM (None: not given).
BOUNDS = {
    "LLaMA-Factory wiki, Llama-2-7B QLoRA + FA2, A100 40GB": dict(
        ids=("lf-wiki-llama2-7b-qlora-fa2-8192", "lf-wiki-llama2-7b-qlora-fa2-65536",
             "lf-wiki-llama2-7b-qlora-fa2-100000"),
        model="llama-2-7b", gpu="a100-40gb", plan=LF_QLORA, fit=8192, oom=65536, grade="B",
        stack="LLaMA-Factory + " + HF, ceiling=200000,
        assumed="the wiki's lengths 8192 (12 GB) fit, 65536 and 100000 OOM; the file has no HF+FA2 row between "
                "8192 and 65536, so the bound is wide"),
    "Unsloth, Llama-3.3-70B QLoRA, HF+FA2, 80 GB": dict(
        ids=("unsloth-llama3.3-70b-qlora-maxctx-80GB-hf-fa2",),
        model="llama-3.1-70b-instruct", gpu="a100-80gb", plan=HF_FA2_QLORA, fit=6916, oom=None, grade="B",
        stack=HF, assumed="Llama-3.3-70B read as the catalogued Llama-3.1-70B-Instruct (the same architecture); "
                          "checkpointing on and AdamW (not stated)"),
    "Unsloth, Llama-3.3-70B QLoRA, HF+FA2, 48 GB": dict(
        ids=("unsloth-llama3.3-70b-qlora-maxctx-48GB-hf-fa2",),
        model="llama-3.1-70b-instruct", gpu="a100-80gb", budget_gib=48, plan=HF_FA2_QLORA, fit=None, oom=1,
        grade="C", stack=HF, assumed="'OOM': not even a short sequence fits; a 48 GB card read as 48 GiB"),
    **{f"Unsloth table, Llama-3.1-8B QLoRA, HF+FA2, {n} GB": dict(
        ids=("unsloth-llama3.1-8b-qlora-maxctx-table",), cell=("hf_fa2", str(n)),
        model="llama-3.1-8b-instruct", gpu="a100-80gb", budget_gib=n, plan=HF_FA2_QLORA,
        fit=None if fit == "OOM" else fit, oom=1 if fit == "OOM" else None, grade="C", stack=HF, ceiling=400000,
        assumed=f"the table's {n} GB read as {n} GiB on an A100's overheads; checkpointing on, AdamW (not stated)")
       for n, fit in ((8, "OOM"), (12, 932), (16, 2551), (24, 5789), (40, 12264), (48, 15502), (80, 28454))},
    "torchtune RFC #1244, Llama-3-8B, batch 1": dict(
        ids=("torchtune-rfc1244-llama3-8b-24k-bs1",),
        model="llama-3-8b", gpu="a100-80gb", grade="C", fit=24000, oom=None, ceiling=400000,
        plan=dict(method="lora", lora_r=8, lora_alpha=16.0, lora_dropout=0.0, lora_targets=("q_proj", "v_proj"),
                  micro_batch=1, gradient_checkpointing=True, optimizer="adamw_torch"),
        stack="torchtune (mid-2024), read as " + HF,
        assumed="a maintainer's '~24k' with no method or GPU: torchtune's llama3/8B_lora_single_device (LoRA r8 "
                "on q,v, activation checkpointing) on an 80 GB A100 assumed; sdpa"),
    "ALST, Llama-3.1-8B full, 1 x H200, baseline": dict(
        ids=("alst-h200-llama3.1-8b-full-sp1-65k",),
        model="llama-3.1-8b-instruct", gpu="h200", plan=dict(FULL, offload="zero3_cpu", packing=True), fit=65000,
        oom=None, grade="A", stack="ArcticTraining (ZeRO-3 offload) on transformers",
        assumed="65K is the ladder's first rung, the longest without Liger, activation offload or tiled MLP "
                "(the next, 300K, needs Liger)"),
    "ALST, Llama-3.1-8B full, 8 x H100, Liger, no SP": dict(
        ids=("alst-h100-llama3.1-8b-full-sp8-llama-8b-no-ulysses-yes-liger-no-extras",),
        model="llama-3.1-8b-instruct", gpu="h100-sxm", gpus=8, sharding="zero3", grade="B", fit=160000, oom=None,
        plan=dict(FULL, offload="zero3_cpu", loss="fused-linear"), ceiling=1000000,
        stack="ArcticTraining (ZeRO-3, optimizer offloaded) on transformers",
        assumed="sequence_parallel_size 1: data parallel over 8 GPUs; ZeRO-3 with the optimizer offloaded read as "
                "zero3_cpu (which also offloads the parameters: 2 GB a GPU that the recipe keeps sharded on the "
                "GPUs); Liger read as --loss fused-linear; past Llama-3.1's 131072 (RoPE, no memory); 'not packed': "
                "ultrachat samples are far shorter than 160000, so the run may never have held a 160000-token "
                "sequence (a weak bound)"),
    "ALST, Llama-3.1-8B full, 8 x H100, no Liger, no SP": dict(
        ids=("alst-h100-llama3.1-8b-full-sp8-llama-8b-no-ulysses-no-liger-no-extras",),
        model="llama-3.1-8b-instruct", gpu="h100-sxm", gpus=8, sharding="zero3", grade="B", fit=32000, oom=None,
        plan=dict(FULL, offload="zero3_cpu", packing=True, attn_impl="flash_attention_2"), ceiling=1000000,
        stack="ArcticTraining (ZeRO-3, optimizer offloaded) on transformers",
        assumed="'no-ulysses': data parallel over 8 GPUs (the file's sequence_parallel_size 8 unused); the ladder's "
                "first rung, not the longest that fits; optimizer offload read as zero3_cpu"),
    "ALST, Llama-3.1-8B full, 8 x H100, Ulysses SP8 + Liger": dict(
        ids=("alst-h100-llama3.1-8b-full-sp8-llama-8b-no-mlp-no-act-offload",),
        model="llama-3.1-8b-instruct", gpu="h100-sxm", gpus=8, sharding="zero3", grade="B", fit=1100000, oom=None,
        plan=dict(FULL, offload="zero3_cpu", packing=True, attn_impl="flash_attention_2", loss="fused-linear",
                  sp_degree=8), ceiling=4000000,
        stack="ArcticTraining (DeepSpeed ZeRO-3 + Ulysses SP for HF, torch 2.8 nightly)",
        assumed="Ulysses over the 8 GPUs (--sp-degree 8); Liger as --loss fused-linear; optimizer offload read as "
                "zero3_cpu; past Llama-3.1's 131072 positions (RoPE, no memory)"),
    "ALST, Llama-3.1-8B full, 8 x H100, Ulysses SP8 + Liger + checkpoint offload": dict(
        ids=("alst-h100-llama3.1-8b-full-sp8-llama-8b-yes-act-offload",),
        model="llama-3.1-8b-instruct", gpu="h100-sxm", gpus=8, sharding="zero3", grade="B", fit=2400000, oom=None,
        plan=dict(FULL, offload="zero3_cpu", packing=True, attn_impl="flash_attention_2", loss="fused-linear",
                  sp_degree=8, activation_offload=True), ceiling=8000000,
        stack="ArcticTraining (DeepSpeed ZeRO-3 + Ulysses SP for HF, torch 2.8 nightly)",
        assumed="as the row above, with ALST's activation-checkpoint offload as --checkpoint-offload (the host RAM "
                "it needs is not checked here: ALST's nodes had 1.9 TB)"),
    "360-LLaMA-Factory, Qwen2.5-14B full, 8 x A800, ring SP8": dict(
        ids=("360lf-qwen2.5-14b-full-sft-sp8-maxlen-175k",),
        model="qwen2.5-14b", gpu="a100-80gb", gpus=8, sharding="zero3", grade="B", fit=175000, oom=None,
        plan=dict(FULL, offload="zero3_cpu", attn_impl="flash_attention_2", loss="plain", sp_degree=8,
                  sp_backend="ring"), ceiling=1000000,
        stack="360-LLaMA-Factory (zigzag ring-flash-attn, ZeRO-3 offload)",
        assumed="an 80 GB A800 read as an A100-80GB; 'no other optimization': the plain loss (fp32 logits of the "
                "shard); the advisor's ring gathers the whole sequence's k/v per layer (torch context parallel's "
                "allgather) where ring-flash-attn passes one block at a time: more memory than 360-LF holds"),
    "Liger README, Llama-3-8B full, FSDP1 8 x A100, batch 8, HF": dict(
        ids=("liger-readme-llama3-8b-fsdp-8xA100-oom4k-vs-16k",), which="HF",
        model="llama-3-8b", gpu="a100-80gb", gpus=8, sharding="fsdp", grade="C", fit=None, oom=4096,
        plan=dict(FULL, micro_batch=8, attn_impl="sdpa"), ceiling=100000, stack="HF Trainer + FSDP1",
        assumed="'Hugging Face models start to OOM at a 4K context length' (a plot's summary); 80 GB A100s "
                "(not stated); bf16 weights and AdamW"),
    "Liger README, Llama-3-8B full, FSDP1 8 x A100, batch 8, HF+Liger": dict(
        ids=("liger-readme-llama3-8b-fsdp-8xA100-oom4k-vs-16k",), which="HF+Liger",
        model="llama-3-8b", gpu="a100-80gb", gpus=8, sharding="fsdp", grade="C", fit=16384, oom=None,
        plan=dict(FULL, micro_batch=8, attn_impl="sdpa", loss="fused-linear"), ceiling=100000,
        stack="HF Trainer + FSDP1 + Liger",
        assumed="'scales up to 16K' (the plot's longest); Liger's fused linear cross-entropy as --loss fused-linear "
                "(its RMSNorm / SwiGLU / RoPE kernels not modelled)"),
}


@lru_cache(maxsize=1)
def models() -> Models:
    return Models()


def model_of(name: str):
    """A catalog model, or memory_vs_published's ARCH config for one the catalog lacks."""
    return models().get(name)


def predict(spec: dict) -> dict:
    """The point's figure on its counter, with the nvidia-smi and reserved figures of the run's peak phase."""
    from advisor.core.plan import Plan

    plan = Plan(**spec["plan"]).validate()
    case = Case(spec["model"], spec["plan"], "nvidia-smi", LOAD_TRAIN, spec["stack"], gpu=spec["gpu"],
                gpus=spec["gpus"], sharding=spec["sharding"])
    phases = train_phases(models(), case, "estimate")
    smi, smi_at = counter_peak(case, phases)
    reserved, res_at = counter_peak(Case(**{**case.__dict__, "counter": "reserved"}), phases)
    primary = reserved if spec["counter"] == "swift" else smi
    return dict(plan=plan, smi=smi, reserved=reserved, at=smi_at, primary=primary)


def longest(spec: dict, headroom: float):
    """advisor estimate --seq-len max for the bound's plan (estimate.py's measure and _longest), at ``headroom``."""
    from advisor.core.catalog import resolve_gpu
    from advisor.core.fit import fits
    from advisor.core.plan import Plan
    from advisor.memory.longest import ceiling_of, longest_seq_len, peaks
    from advisor.memory.sharding import shard_report
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    model, gpu = model_of(spec["model"]), resolve_gpu(spec["gpu"])
    gpus, sharding = spec.get("gpus", 1), spec.get("sharding", "ddp")
    budget = spec["budget_gib"] * GiB if spec.get("budget_gib") else gpu.memory_bytes

    def measure(plan):
        report = get_backend("estimate").measure(model, plan, gpu)
        if gpus > 1:
            report = shard_report(report, model, plan, gpus, sharding, gpu)
        return with_phases(model, plan, gpu, report)

    plan = Plan(**{**spec["plan"], "seq_len": 1024}).validate()
    ceiling = max(ceiling_of(model), spec.get("ceiling", 0))
    return longest_seq_len(peaks(measure, plan), lambda peak: fits(peak, budget, headroom), ceiling, step=1), plan


def bound_verdict(spec: dict, got: int | None) -> str:
    fit, oom = spec["fit"], spec["oom"]
    if fit is None:  # only an OOM published
        if oom == 1:
            return "agrees (nothing fits)" if got is None else f"disagrees: {got:,} tokens fit"
        return "agrees" if got is None or got < oom else f"disagrees: {got:,} >= the OOM at {oom:,}"
    if got is None or got < fit:
        return "under: below the published length (conservative)"
    if oom is not None:
        return "holds" if got < oom else f"over: at or above the OOM at {oom:,}"
    return "holds" if got <= NEAR * fit else f"over: {got / fit:.2f}x the published length (optimistic)"


def published(point: dict) -> tuple[float | None, str]:
    m = point.get("per_gpu_memory") or {}
    v, unit = m.get("value"), (m.get("unit") or "")
    if isinstance(v, (int, float)) and unit in UNITS:
        return v * UNITS[unit], f"{v:g} {unit}"
    text = point.get("memory_semantics") or ""
    if isinstance(v, str) and v:
        return None, f"{text}: {v}" if text else v
    return None, text or "not stated"


def compare(points: list[dict]) -> tuple[list[str], list[str], list[float]]:
    rows, notes, ratios = [], [], []
    for p in points:
        spec = EXPRESSED.get(p["id"])
        if spec is None:
            continue
        pub_bytes, pub_text = published(p)
        g = predict(spec)
        unit, un = (GiB, "GiB") if "GiB" in pub_text else (GB, "GB")
        ratio = g["primary"] / pub_bytes
        if p["grade"] in ("A", "B"):
            ratios.append(ratio)
        counter = ("script comment: reserved (or nvidia-smi)" if spec["counter"] == "swift"
                   else "not stated: nvidia-smi")
        gpus = f"{spec['gpus']} GPUs {spec['sharding']}" if spec["gpus"] > 1 else "1 GPU"
        rows.append(f"| {p['id']} | {p['grade']} | {spec['model']} | {g['plan'].short()}, {gpus}, {spec['gpu']} | "
                    f"{counter} | {pub_text} | {g['reserved'] / unit:.1f} / {g['smi'] / unit:.1f} {un} | "
                    f"{ratio:.2f}x |")
        notes.append(f"- `{p['id']}` ({spec['stack']}): {spec['assumed']}. Peak in {g['at']}.")
    return rows, notes, ratios


def bounds(points: list[dict]) -> tuple[list[str], dict]:
    by_id = {p["id"]: p for p in points}
    rows, verdicts = [], {}
    for label, spec in BOUNDS.items():
        fit0, plan = longest(spec, 0.0)
        fit5, _ = longest(spec, 0.05)
        got = fit0.max_seq_len
        verdict = bound_verdict(spec, got)
        verdicts[label] = verdict
        budget = f"{spec['budget_gib']} GiB" if spec.get("budget_gib") else spec["gpu"]
        gpus = f"{spec['gpus']} x {budget} {spec['sharding']}" if spec.get("gpus", 1) > 1 else f"1 x {budget}"
        pub = f"fit {spec['fit']:,}" if spec["fit"] else "nothing fits" if spec["oom"] == 1 else "-"
        if spec["oom"] and spec["oom"] > 1:
            pub += f"; OOM at {spec['oom']:,}"
        ratio = f"{got / spec['fit']:.2f}x" if got and spec["fit"] else "-"

        def show(f):
            if f.max_seq_len is None:
                return "none fits"
            return f"{f.max_seq_len:,}" + (" (ceiling)" if f.at_ceiling else "")
        grades = "/".join(sorted({by_id[i]["grade"] for i in spec["ids"]}))
        rows.append(f"| {label} | {', '.join(f'`{i}`' for i in spec['ids'])} | {grades} | {spec['model']} | "
                    f"{plan.short().replace(' s1024', '')}, {gpus} | {pub} | {show(fit0)} | {show(fit5)} | "
                    f"{ratio} | {fit0.stops or '-'} | {verdict} |")
    return rows, verdicts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "long_context_vs_published.md"))
    args = ap.parse_args(argv)
    points = json.loads(DATA.read_text())["long_context"]
    rows, notes, ratios = compare(points)
    brows, verdicts = bounds(points)
    counted = {i for s in BOUNDS.values() for i in s["ids"]} | set(EXPRESSED)
    today = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    held = sum(v.startswith(("holds", "agrees")) for v in verdicts.values())
    lines = [
        "# Long-context fine-tuning: the advisor against published runs", "",
        f"Generated {today} (UTC) by `python benchmarks/long_context_vs_published.py` over `{DATA}` (`long_context`, "
        f"{len(points)} points; grades A measured with the configuration stated, B a detail unstated, C a claim or "
        "ambiguous). The advisor is the closed form (estimate backend, sharded per GPU by advisor.memory.sharding, "
        "the run's phases attached; counters read as benchmarks/memory_vs_published.py reads them). "
        f"{len(EXPRESSED)} points are compared on their memory figure, {len(BOUNDS)} bounds (from "
        f"{len({i for s in BOUNDS.values() for i in s['ids']})} points) on `max_seq_len`; every other point is listed "
        "below with what differs.", "",
        "## Compared", "",
        "Predicted: `reserved / nvidia-smi` of the run's peak phase per GPU. The ratio is predicted / published on the "
        "point's counter: nvidia-smi where the counter is not stated, reserved for an ms-swift comment (its log's "
        "`memory(GiB)` is torch.cuda.max_memory_reserved).", "",
        "| point | grade | model | plan as the advisor reads it | counter | published | predicted | ratio |",
        "|---|---|---|---|---|---|---|---|", *rows, ""]
    if ratios:
        lines += [f"Summary over the compared A/B points ({len(ratios)}): median {statistics.median(ratios):.2f}x, "
                  f"range {min(ratios):.2f}-{max(ratios):.2f}x (predicted / published, each on its counter). Grade-C "
                  "rows are shown, not summarised.", ""]
    lines += ["Assumptions of the compared points:", "", *notes, "",
              "## Bounds: the longest length that fits", "",
              "`max_seq_len`: `advisor estimate --seq-len max` for the plan (bisection by the token on the closed "
              "form, advisor.memory.longest), on the whole card (headroom 0: what a run that filled the card found) "
              "and with the advisor's default 5% headroom (what it answers). The search stops at the model's trained "
              "context unless the published length is past it (the runs used RoPE scaling, which costs no memory): "
              "then at the row's ceiling. A bound holds when headroom-0 `max_seq_len` is at least the published "
              f"length that fit and below the OOM length the source gives, or at most {NEAR}x the published length "
              "where it gives none. `stops`: the ledger category that grows most past the answer.", "",
              "| bound | point(s) | grade | model | plan (length searched) | published | max_seq_len (headroom 0) | "
              "max_seq_len (5%) | ratio | stops | verdict |",
              "|---|---|---|---|---|---|---:|---:|---:|---|---|", *brows, "",
              f"Bounds that hold: {held} of {len(BOUNDS)}.", "",
              "Assumptions of the bounds:", "",
              *(f"- {label} ({spec['stack']}): {spec['assumed']}." for label, spec in BOUNDS.items()), "",
              "## Not compared", ""]
    groups: dict[str, list[str]] = {}
    for p in points:
        if p["id"] in counted:
            continue
        group, why = WHY_NOT.get(p["id"], ("Other", "not mapped"))
        groups.setdefault(group, []).append(
            f"| {p['id']} | {p['grade']} | {p['model'][:45]} | {p['stack'][:60].replace('|', '/')} | "
            f"{published(p)[1][:70].replace('|', '/')} | {str(p.get('seq_len') or '-')[:24]} | {why} |")
    for group in GROUP_ORDER:
        if group in groups:
            lines += [f"### {group}", "", "| point | grade | model | stack | published | length | what differs |",
                      "|---|---|---|---|---|---|---|", *groups.pop(group), ""]
    for group, g_rows in groups.items():
        lines += [f"### {group}", "", "| point | grade | model | stack | published | length | what differs |",
                  "|---|---|---|---|---|---|---|", *g_rows, ""]
    lines += ["### For reference only (not compared)", "", *reference_lines(points), "", *STACK_SECTIONS, "",
              *findings()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


# ---- not compared -----------------------------------------------------------------------------------------------
SP = "Sequence parallelism"
UNSLOTH = "Unsloth's kernels and offloaded checkpointing"
TILED = "Tiled MLP, activation-checkpoint offload (ALST's ladder)"
MEGATRON = "Megatron"
DATASET = "The dataset decides the length"
NOT_RUN = "Not a training run, or no configuration"
GROUP_ORDER = (SP, UNSLOTH, TILED, MEGATRON, DATASET, NOT_RUN)

_SP_SWIFT = ("ms-swift's sequence parallelism (Ulysses heads x zigzag ring) splits every sequence over the SP "
             "group; CELOSS_PARALLEL_SIZE chunks its cross-entropy; the advisor has no sequence-parallel knob")
_SP_360 = ("360-LLaMA-Factory: zigzag ring attention (ring-flash-attn) over the SP group, ZeRO-3 with offload, "
           "sequences padded to a multiple of the SP degree; its DPO rows and 72B rows (32 x A800 in the table) "
           "left as listed")
_SP_EASY = ("EasyContext: ring / zigzag ring attention (ring-flash-attn, yunchang) over 8 GPUs, ZeRO-3 with "
            "parameter and optimizer offload, flash-attn's fused cross-entropy; no advisor knob for SP")
_SP_ALST = ("ALST: Ulysses SP over 8 GPUs (all-to-all of heads), Liger, tiled MLP and/or activation-checkpoint "
            "offload; the advisor's --sp-degree and --checkpoint-offload express the rest, tiled MLP not (yet)")
_SWIFT2 = ("ChatGLM3-6B-32K is not in the catalog; ms-swift 2.x's xtuner-based Ulysses SP; method (2.x default "
           "LoRA) and length (the page's max_length 2048 unless overridden) not stated")
_UNS = ("Unsloth: its Triton kernels (RoPE, RMSNorm, SwiGLU, LoRA MLP / QKV with a hand-written backward that saves "
        "fewer tensors), chunked cross-entropy, and 'unsloth' gradient checkpointing that offloads each layer's saved "
        "input to the CPU")
WHY_NOT = {
    **{i: (SP, _SP_SWIFT) for i in ("swift-qwen2.5-3b-lora-64k-sp8-8xA100-40GiB",)},
    "swift-qwq-32b-lora-512k-sp8-zero3offload-8xA100": (
        SP, _SP_SWIFT + "; QwQ-32B is not in the catalog (Qwen2.5-32B's architecture); YaRN to 512000"),
    **{i: (SP, _SWIFT2) for i in ("swift2-chatglm3-6b-32k-sp1-2gpu", "swift2-chatglm3-6b-32k-sp2-2gpu",
                                  "swift2-chatglm3-6b-32k-sp4-4gpu", "swift2-chatglm3-6b-32k-sp2-4gpu")},
    **{i: (SP, _SP_360) for i in ("360lf-qwen2.5-72b-full-sft-sp8-maxlen-128k",
                                  "360lf-qwen2.5-7b-full-dpo-sp4-maxlen-32k",
                                  "360lf-qwen2.5-7b-full-dpo-sp8-maxlen-84k",
                                  "360lf-qwen2.5-14b-full-dpo-sp4-maxlen-32k",
                                  "360lf-qwen2.5-14b-full-dpo-sp8-maxlen-72k",
                                  "360lf-qwen2.5-72b-full-dpo-sp8-maxlen-46k",
                                  "360lf-qwen2.5-72b-full-dpo-sp16-maxlen-86k")},
    "easycontext-llama2-7b-full-data_parallel-64k": (
        SP, "EasyContext's data-parallel row (no SP) of its SP comparison: ZeRO-3 with parameter and optimizer "
            "offload, flash-attn's fused cross-entropy (no fp32 logits), A100 capacity not stated, only 'runs': "
            "expressible in part (zero3_cpu), left with its SP siblings (the table measured throughput, not memory)"),
    **{i: (SP, _SP_EASY) for i in ("easycontext-llama2-7b-full-zigzag_ring_attn-64k",
                                   "easycontext-llama2-7b-full-zigzag_ring_attn-512k",
                                   "easycontext-llama2-7b-full-zigzag_ring_attn-700k")},
    **{i: (SP, _SP_ALST) for i in ("alst-h100-llama3.1-8b-full-sp8-llama-8b-yes-mlp",
                                   "alst-h100-llama3.1-8b-full-sp8-llama-8b",
                                   "alst-h100-qwen3-32b-full-sp8-1550k",
                                   "alst-h100-llama-3.1-70b-instruct-full-sp8-200k")},
    **{i: (UNSLOTH, _UNS + " (with LLaMA-Factory's use_unsloth)") for i in (
        "lf-wiki-llama2-7b-qlora-unsloth-fa2-8192", "lf-wiki-llama2-7b-qlora-unsloth-fa2-16384",
        "lf-wiki-llama2-7b-qlora-unsloth-fa2-65536", "lf-wiki-llama2-7b-qlora-unsloth-fa2-100000")},
    **{i: (UNSLOTH, _UNS + " plus Apple's Cut Cross Entropy (no logits materialized)") for i in (
        "unsloth-llama3.3-70b-qlora-maxctx-80GB-unsloth-cce", "unsloth-llama3.3-70b-qlora-maxctx-48GB-unsloth-cce")},
    **{i: (UNSLOTH, _UNS + " (before CCE)") for i in (
        "unsloth-llama3.3-70b-qlora-maxctx-80GB-unsloth-old", "unsloth-llama3.3-70b-qlora-maxctx-48GB-unsloth-old")},
    "unsloth-llama3.1-70b-48k-tokens-a100-80gb": (
        UNSLOTH, _UNS + "; a claim (48K tokens as 8192 x 5); its 'vs 7K tokens without Unsloth' is the HF+FA2 "
                        "bound of the Llama-3.3-70B row above (6,916)"),
    "unsloth-gpt-oss-20b-qlora-500k-h100": (
        UNSLOTH, _UNS + ", chunked fused CE with a VRAM-adaptive chunk, tiled MLP; gpt-oss-20b is catalogued but "
                        "its MoE closed form is not checked at these lengths; claims only"),
    "unsloth-issue2366-gemma3-12b-8bit-lora-h100-14k": (
        UNSLOTH, "Unsloth FastModel + TRL on an 8-bit base: " + _UNS + "; a user report (C), rank and batch not "
                 "stated"),
    "alst-h200-llama3.1-8b-full-sp1-1200k": (
        TILED, "one GPU with Liger, activation-checkpoint offload to the CPU and tiled MLP (MLP computed over "
               "sequence tiles, ~10x less MLP memory): the advisor has activation offload and the fused loss, but "
               "no tiled MLP"),
    "alst-h100-llama3.1-8b-full-sp1-llama-8b": (
        TILED, "one H100 with Liger, activation-checkpoint offload and tiled MLP (555000 hit a Triton illegal "
               "memory access, not an OOM); no tiled-MLP knob"),
    "alst-h100-qwen3-32b-full-sp1-230k": (
        TILED, "one H100, Qwen3-32B full with parameter / optimizer / activation offload, tiled MLP and Liger; no "
               "tiled-MLP knob"),
    "swift-megatron-qwen2.5-7b-full-32k-tp4-4x50GB": (
        MEGATRON, "Megatron-SWIFT: tensor parallelism 4 with Megatron sequence parallelism, full recompute, fused "
                  "cross-entropy, packed 32K; no advisor knob for TP/SP"),
    "swift-qwen2.5-7b-full-8k-bs8-zero3-liger-paddingfree-false": (
        DATASET, "batch 8 padded to its longest sample, under max_length 8192: the dataset's lengths (not "
                 "published) set each batch's length; 60 GiB a GPU, ZeRO-3 on 4 GPUs, Liger"),
    "swift-qwen2.5-7b-full-8k-bs8-zero3-liger-paddingfree-true": (
        DATASET, "padding_free: the batch's 8 samples flattened into one row of their summed real lengths (the "
                 "dataset's, not published); the Plan's padding_free is DPO's, --packing the nearest; 44 GiB"),
    "cce-readme-gemma2-loss-memory-a100": (
        NOT_RUN, "a loss-layer benchmark (Gemma-2's 256k vocabulary, op memory of CE forward + backward), not a "
                 "training run; the advisor's plain vs fused-linear loss terms are the same contrast"),
    "yarn-issue23-7b-64k-8xA100-80GB": (
        NOT_RUN, "YaRN's scripts (accelerate + DeepSpeed) on 8 x 80 GB at 64K: method, ZeRO stage, batch and "
                 "checkpointing not stated; Yarn-Llama-2-7b-64k not catalogued"),
}

# The nearest advisor plan for some not-compared points, for reference only (not in any summary, nothing fitted).
REFERENCE = {
    "lf-wiki-llama2-7b-qlora-unsloth-fa2-65536": dict(
        model="llama-2-7b", gpu="a100-40gb", gpus=1, sharding="ddp", counter="unstated", stack=HF,
        plan=dict(LF_QLORA, seq_len=65536), why="the same QLoRA plan on the HF stack at 65536 (which OOMed there)"),
    "lf-wiki-llama2-7b-qlora-unsloth-fa2-100000": dict(
        model="llama-2-7b", gpu="a100-40gb", gpus=1, sharding="ddp", counter="unstated", stack=HF,
        plan=dict(LF_QLORA, seq_len=100000, activation_offload=True, loss="chunked"),
        why="the HF plan with the advisor's nearest levers to Unsloth's (activation offload of the checkpointed "
            "inputs, a chunked loss) at 100000"),
}
REFERENCE_BOUNDS = {
    "unsloth-llama3.3-70b-qlora-maxctx-80GB-unsloth-cce": dict(
        model="llama-3.1-70b-instruct", gpu="a100-80gb", plan=dict(HF_FA2_QLORA, activation_offload=True,
                                                                    loss="fused-linear"),
        why="activation offload + fused-linear loss (the advisor's nearest to offloaded GC + CCE)"),
    "unsloth-llama3.3-70b-qlora-maxctx-80GB-unsloth-old": dict(
        model="llama-3.1-70b-instruct", gpu="a100-80gb", plan=dict(HF_FA2_QLORA, activation_offload=True,
                                                                    loss="chunked"),
        why="activation offload + chunked loss (the advisor's nearest to offloaded GC + Unsloth's chunked CE)"),
}


def reference_lines(points: list[dict]) -> list[str]:
    out = []
    by_id = {p["id"]: p for p in points}
    for pid, spec in REFERENCE.items():
        p = by_id[pid]
        g = predict(spec)
        pub_bytes, pub_text = published(p)
        out.append(f"- `{pid}` (grade {p['grade']}, Unsloth: {pub_text}): {spec['why']}, `{g['plan'].short()}`, "
                   f"predicts {g['smi'] / GB:.1f} GB nvidia-smi ({g['smi'] / pub_bytes:.2f}x the Unsloth figure) on "
                   "the A100 40GB: a reference for what Unsloth saves, not a comparison.")
    for pid, spec in REFERENCE_BOUNDS.items():
        p = by_id[pid]
        fit, plan = longest({**spec, "fit": p["seq_len"], "oom": None}, 0.0)
        got = fit.max_seq_len
        out.append(f"- `{pid}` (grade {p['grade']}, Unsloth: {p['seq_len']:,} tokens on 80 GB): {spec['why']}, "
                   f"`{plan.short().replace(' s1024', '')}`: max_seq_len "
                   f"{'none' if got is None else f'{got:,}'} on the whole card"
                   + (f" ({got / p['seq_len']:.2f}x)" if got else "") + ": a reference, not a comparison.")
    return out


def ledger(name: str, fields: dict, gpu_name: str, gpus: int = 1, sharding: str = "ddp"):
    """The run's report (estimate backend, sharded, phases attached) of one plan: for the findings below."""
    from advisor.core.catalog import resolve_gpu
    from advisor.core.plan import Plan
    from advisor.memory.sharding import shard_report
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    model, gpu, plan = model_of(name), resolve_gpu(gpu_name), Plan(**fields).validate()
    report = get_backend("estimate").measure(model, plan, gpu)
    if gpus > 1:
        report = shard_report(report, model, plan, gpus, sharding, gpu)
    return with_phases(model, plan, gpu, report)


def findings() -> list[str]:
    """What looked off in the advisor, with its own numbers (nothing here changes a prediction)."""
    out = ["## What looked off in the advisor", ""]
    # 1. the Unsloth table's HF+FA2 column: what the advisor leaves free at each published length
    table = [(n, fit) for n, fit in ((12, 932), (16, 2551), (24, 5789), (40, 12264), (48, 15502), (80, 28454))]
    gaps = []
    for n, fit in table:
        r = ledger("llama-3.1-8b-instruct", dict(HF_FA2_QLORA, seq_len=fit), "a100-80gb")
        gaps.append((fit, n - r.run_peak_bytes / GiB))
    slope, intercept = statistics.linear_regression([g[0] for g in gaps], [g[1] for g in gaps])
    out.append("- The Llama-3.1-8B QLoRA table (HF+FA2 column): at each published length the advisor's run peak "
               "leaves " + ", ".join(f"{gap:.1f} GiB at {fit:,} ({n} GB)" for (n, _), (fit, gap) in zip(table, gaps))
               + f" of the card free: a line of {intercept:.1f} GiB + {slope * GiB / 1e6:.2f} MB a token (least "
               "squares over the six cells, a description of the residual, not a correction). The per-token part is "
               f"{slope * GiB / (4 * 128256):.2f}x a 4-byte row of the 128,256-token vocabulary: the transformers of "
               "December 2024 (4.46-4.47) upcast the logits to fp32 and made a contiguous fp32 copy of the shifted "
               "logits in ForCausalLMLoss, where the loss the advisor models shifts the labels (the same gap "
               "memory_vs_published notes for LLaMA-Factory's 2023 runs); the fixed part (loading, the 4-bit "
               "quantization's buffers, Unsloth's harness) is not identified. So every cell is optimistic, most on "
               "small cards (2.45x at 12 GB), and at 8 GB the advisor fits 374 tokens where the table says OOM.")
    r70 = ledger("llama-3.1-70b-instruct", dict(HF_FA2_QLORA, seq_len=6916), "a100-80gb")
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in r70.device.items() if v)
    out.append(f"- Llama-3.3-70B (HF+FA2, 80 GB): at the published 6,916 tokens the advisor's run peak is "
               f"{r70.run_peak_bytes / GiB:.1f} GiB ({parts}"
               f" GiB), {80 - r70.run_peak_bytes / GiB:.1f} GiB under the card: more than the 8B line explains "
               f"({intercept + slope * 6916:.1f} GiB at that length); hence 1.59x.")
    # 2. ZeRO-3 full fine-tuning in bf16: the optimizer states and the step's transient
    e = EXPRESSED["swift-qwen2.5-7b-full-16k-zero3-liger-4x42GB"]
    r = ledger(e["model"], e["plan"], e["gpu"], e["gpus"], e["sharding"])
    n_params = model_of(e["model"]).params_total
    d = r.device
    out.append(f"- ZeRO-3 full fine-tuning in bf16 (the ms-swift 16K rows, 4 GPUs): fp32 optimizer states "
               f"{d.get('optimizer_states', 0) / GiB:.2f} GiB and fp32 master weights "
               f"{d.get('master_weights', 0) / GiB:.2f} GiB a rank (DeepSpeed's fp32 partition, "
               "advisor.memory.sharding.fp32_trainable_state: 12 B a parameter / 4 ranks); the optimizer step's "
               f"foreach temporary (2 B x {n_params / 1e9:.2f}B parameters on one GPU) is a rank's partition's, 1/4 "
               "(DeepSpeed steps each rank's partition, in sub-groups of sub_group_size): the ledger's transient is "
               f"{d.get('transient', 0) / GiB:.2f} GiB. Before the "
               "temporary was sharded (2026-12-07) it was kept whole on each GPU and these rows were predicted "
               "at 48.2 / 48.7 GB against 42 GB.")
    a = ledger("llama-3.1-8b-instruct", dict(FULL, offload="zero3_cpu", packing=True, seq_len=65000), "h200")
    out.append(f"- The ALST baseline (8B full, zero3_cpu, 65K on one H200): run peak {a.run_peak_bytes / GiB:.1f} GiB, "
               f"of which transient {a.device.get('transient', 0) / GiB:.1f} GiB (the plain loss over 65,000 x "
               f"128,256 logits) and overhead {a.device.get('overhead', 0) / GiB:.1f} GiB (the allocator's "
               "fragmentation model, which grows with the transients). The published 137.36 'GB' is 147.5e9 B if it "
               "is DeepSpeed's see_memory_usage style (bytes / 2^30 printed as GB): then the ratio is "
               f"{a.run_peak_bytes / (137.36 * GiB):.2f}x, not the 1.09x the table shows on decimal GB.")
    return out


STACK_SECTIONS = [
    "## What each stack does differently", "",
    "### Unsloth", "",
    "Its own Triton kernels for RoPE, RMSNorm and SwiGLU and a hand-written LoRA backward for the MLP and the "
    "attention projections (fewer saved tensors than autograd through peft's layers); a chunked cross-entropy that "
    "never holds fp32 logits of the whole sequence (from December 2024 Apple's Cut Cross Entropy, no logits at all); "
    "and 'unsloth' gradient checkpointing, which copies each layer's checkpointed input to pinned CPU memory and "
    "back in backward. Its table's 'Hugging Face + FA2' column is the stack the advisor plans, and the one checked "
    "as bounds above; its Unsloth columns are not (the reference lines show the advisor's nearest levers, activation "
    "offload and the fused or chunked loss, for contrast only).", "",
    "### torchtune", "",
    "Its own model code and LoRA layers (bf16 adapters and Adam states), activation checkpointing of whole layers, "
    "and in mid-2024 (the RFC's date) nn.CrossEntropyLoss over the output upcast to fp32; the chunked "
    "CEWithChunkedOutputLoss, activation offloading and torch.compile came later. The '~24k for llama3 8b with "
    "bsz=1' names no method or GPU; the bound assumes its single-device LoRA config on an 80 GB card.", "",
    "### ms-swift (CELOSS_PARALLEL_SIZE)", "",
    "Under `--sequence_parallel_size` ms-swift replaces the loss with its SP loss (swift/trainers/sequence_parallel): "
    "each rank's slice of the logits is flattened and, with `CELOSS_PARALLEL_SIZE=N` (default 0: off), its "
    "cross-entropy is computed by `ChunkedCrossEntropyLoss` over chunks of N tokens (the fp32 upcast and the "
    "softmax gradient held for one chunk at a time), then the per-token losses are gathered over the SP group. The "
    "model still materializes the bf16 logits of its slice. It is a chunked loss on the SP path only: the "
    "advisor's `--loss chunked` chunks the output projection too, and the advisor has no SP. Without SP (the ZeRO-3 "
    "Liger rows) ms-swift runs transformers' Trainer with Liger's kernels, which the advisor reads as "
    "`--loss fused-linear`.", "",
    "### ArcticTraining / ALST (a PyTorch nightly)", "",
    "The recipes pin `torch==2.8.0.dev20250507` (the nightly; 'earlier versions either had memory leaks or weren't as "
    "memory-efficient', the recipes' README). The ALST paper: PyTorch 2.6.0-2.7.0 held over 3 GiB a GPU more "
    "because of a known dist.barrier issue (fixed in 2.7.1), and `all_reduce_object` costs another 3 GiB a GPU, so "
    "ALST uses `all_reduce`; it also runs expandable segments, 1-D position ids in place of a 4-D attention mask, "
    "DeepSpeed ZeRO-3 with parameter and optimizer offload (cpu_adam), then Liger's fused loss, activation-checkpoint "
    "offload to the CPU, tiled MLP and Ulysses SP. The advisor has no term for a PyTorch release's own overhead: "
    "its prediction is for a release without that 3 GiB. The 65K baseline is compared on its figure and as a bound; "
    "the rest of the ladder needs tiled MLP or SP.", "",
    "### LLaMA-Factory, Liger, EasyContext, 360-LLaMA-Factory, YaRN", "",
    "LLaMA-Factory's wiki rows run transformers + peft + bitsandbytes with FlashAttention-2 (the advisor's stack; "
    "the 2024 loss upcast the logits to fp32 with a forward hook and copied the shifted logits, which "
    "memory_vs_published notes are not modelled); its Unsloth rows are Unsloth. Liger's README summarises a plot "
    "(HF FSDP1 OOMs from 4K at batch 8, HF+Liger reaches 16K). EasyContext and 360-LLaMA-Factory are ring-attention "
    "SP stacks on DeepSpeed ZeRO-3 offload. YaRN's thread gives a GPU count only.",
]

if __name__ == "__main__":
    raise SystemExit(main())
