"""Predicted vs published GPU memory of vision-language fine-tuning runs, each on the point's own counter.

Every point of ``../shared/published_runs/vlm_longctx_runs.json`` (its ``vlm`` list; grades A/B/C) is listed. A point
whose run the advisor expresses (a catalogued vision-language model trained by transformers' Trainer with peft, as
ms-swift's ``swift sft`` and qwen-vl-finetune run it) gets the advisor's closed-form prediction of the part of memory
the point measures:

| the point's counter | the advisor's figure |
|---|---|
| an ms-swift script comment ("# 20GiB": its log's memory(GiB), i.e. max_memory_reserved, or nvidia-smi) | the run's
  peak phase: reserved bytes (the log's counter) and reserved + CUDA context (nvidia-smi) |
| "needs N x 80 GB" / "OOM" | whether the run's peak fits the card |

A dataset's image sizes (and the text beside them) are rarely published: each point states the sizes it assumes and,
where unknown, is predicted at two sizes (a range). A stale comment (its commit's configuration differs from the
script's HEAD) is compared with the configuration at the comment's commit. Other stacks (Megatron-SWIFT's tensor /
expert parallelism, Unsloth's kernels and offloaded checkpointing, MiniCPM-V / LLaVA / InternVL / VideoLLaMA2's own
scripts) and models the catalog lacks are listed with what differs, never fitted.

Run: python benchmarks/vlm_vs_published.py [--out reports/vlm_vs_published.md]   (the closed form: seconds)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = Path("/work/shared/published_runs/vlm_longctx_runs.json")
GiB = 2**30
GB = 10**9
UNITS = {"GiB": GiB, "GB": GB}

# ms-swift `swift sft` defaults (swift/llm/argument): lora_dropout 0.05, adamw_torch, gradient_checkpointing true,
# vit_gradient_checkpointing None -> follows gradient_checkpointing (dynamic_gradient_checkpointing over the tower,
# vision_tower.enable_input_require_grads(): the frozen tower records its graph, checkpointed), freeze_vit /
# freeze_aligner true (all-linear reaches the language model only), attn_impl unset -> sdpa, bf16.
SWIFT_LORA = dict(method="lora", lora_r=8, lora_alpha=32.0, lora_dropout=0.05, lora_targets="all-linear",
                  precision="bf16", optimizer="adamw_torch", gradient_checkpointing=True,
                  vision_gradient_checkpointing=True, attn_impl="sdpa", vision_tower="frozen", train_projector=False)
SWIFT = "ms-swift `swift sft` (transformers' Trainer, peft, DeepSpeed)"
BUDGET_1M = 1003520  # MAX_PIXELS=1003520 (1280 image tokens of 28 px on Qwen2/2.5-VL)

# The points the advisor expresses: the catalog model, the Plan's fields, the samples the range spans (each merged
# into the plan; "packed" fills a packed sequence with as many such samples as fit), the card(s) and the counter.
EXPRESSED = {
    "swift-qwen2vl7b-lora-grounding-coco-20GiB": dict(
        model="qwen2-vl-7b-instruct", gpu="a100-80gb", gpus=1, sharding="ddp", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, max_pixels=BUDGET_1M, micro_batch=1, grad_accum=16, seq_len=256),
        samples={"COCO 640x480": dict(image_sizes=("640x480",)), "COCO 640x640": dict(image_sizes=("640x640",))},
        assumed="one COCO image per sample (640x480 typical, 640x640 COCO's largest), 256 text tokens (grounding "
                "prompt and boxes) under max_length 2048; GPU not stated (an 80 GB card: only the overhead depends "
                "on it)"),
    "swift-qwen2vl7b-lora-latexocr-20GB": dict(
        model="qwen2-vl-7b-instruct", gpu="a100-80gb", gpus=1, sharding="ddp", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, max_pixels=BUDGET_1M, micro_batch=1, grad_accum=16, seq_len=128),
        samples={"crop 400x100": dict(image_sizes=("400x100",)), "crop 800x200": dict(image_sizes=("800x200",))},
        assumed="compared with the comment's commit c44cb700a (Qwen2-VL-7B, max_length 2048), not HEAD's "
                "Qwen2.5-VL-7B at 4096; a handwriting crop 400x100 to 800x200 (sizes not published), 128 text "
                "tokens (a LaTeX formula)"),
    "swift-qwen2vl7b-lora-okvqa-22GiB-defaultpixels": dict(
        model="qwen2-vl-7b-instruct", gpu="a100-80gb", gpus=1, sharding="ddp", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, micro_batch=1, grad_accum=16, seq_len=128),
        samples={"COCO 640x480": dict(image_sizes=("640x480",)), "COCO 640x640": dict(image_sizes=("640x640",))},
        assumed="compared with the first version b40f31df7 (Qwen2-VL-7B, OK-VQA, no MAX_PIXELS: the processor's "
                "12,845,056, which a COCO image is far below), not HEAD's caption.sh (Qwen2.5-VL, MAX_PIXELS "
                "1003520, COCO captions) that kept the comment; 3.0's default targets all-linear; 128 text tokens"),
    "swift-qwen2.5vl7b-lora-predict-with-generate-20GiB": dict(
        model="qwen2-vl-7b-instruct", gpu="a100-80gb", gpus=1, sharding="ddp", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, max_pixels=BUDGET_1M, micro_batch=1, grad_accum=16, seq_len=128, eval_batch=1,
                  max_new_tokens=256),
        samples={"crop 400x100": dict(image_sizes=("400x100",)), "crop 800x200": dict(image_sizes=("800x200",))},
        assumed="the comment predates e97cb71ee (which swapped in Qwen2.5-VL-7B and eval batch 2 under it): "
                "Qwen2-VL-7B, eval batch 1 as the note says; the script's LaTeX_OCR:human_handwrite crops "
                "(400x100 to 800x200, 128 text tokens); a generation-based eval of 256 new tokens (assumed)"),
    "swift-qwen2.5vl7b-lora-video-2x24GB": dict(
        model="qwen2.5-vl-7b-instruct", gpu="a100-80gb", gpus=2, sharding="zero2", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, micro_batch=1, grad_accum=8, video_frames=12, video_max_pixels=50176),
        samples={"12 frames + 256 text": dict(seq_len=256), "12 frames + 1024 text": dict(seq_len=1024)},
        assumed="a VideoChatGPT clip sampled to FPS_MAX_FRAMES 12 frames at VIDEO_MAX_PIXELS 50176 (the most a "
                "sample holds), its answer 256 to 1024 text tokens (max_length 2048); ZeRO-2 on 2 GPUs"),
    "swift-qwen2.5vl7b-lorallm-fullvit-4x22GiB": dict(
        model="qwen2.5-vl-7b-instruct", gpu="a100-80gb", gpus=4, sharding="zero2", counter="swift",
        stack=SWIFT + ", tuner lora_llm",
        plan=dict(SWIFT_LORA, lora_r=16, lora_dropout=0.0, vision_tower="full", train_projector=True,
                  max_pixels=BUDGET_1M, micro_batch=1, grad_accum=4, seq_len=256),
        samples={"COCO 640x480": dict(image_sizes=("640x480",)), "COCO 640x640": dict(image_sizes=("640x640",))},
        assumed="at a3db5c8fd the script is examples/train/multimodal/custom_tuner/lora_llm_full_vit.sh: a custom "
                "tuner, LoRA r16 (peft's default dropout 0) on '^model.layers.*' and model.visual (tower and merger) "
                "trained in full, the tower checkpointed (dynamic_gradient_checkpointing), ZeRO-2 on 4 GPUs; one COCO "
                "image (640x480 / 640x640), 256 text tokens under max_length 8192"),
    "swift-qwen2.5vl7b-lora-packing8k-4x36GB": dict(
        model="qwen2.5-vl-7b-instruct", gpu="a100-80gb", gpus=4, sharding="zero2", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, attn_impl="flash_attention_2", packing=True, max_pixels=BUDGET_1M, micro_batch=1,
                  grad_accum=1),
        samples={"packed: 400x100 crops": dict(packed=(8192, "400x100", 110)),
                 "packed: 800x200 crops": dict(packed=(8192, "800x200", 110))},
        assumed="packing to 8192 tokens: as many LaTeX_OCR samples as fit (an image 400x100 or 800x200 plus ~110 "
                "text tokens each), every image a sample of the pack; ZeRO-2 on 4 GPUs, flash-attention"),
    "swift-qwen3vl4b-lora-mixed-packing-2x21GiB": dict(
        model="qwen3-vl-4b-instruct", gpu="a100-80gb", gpus=2, sharding="zero2", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, attn_impl="flash_attention_2", packing=True, vision_gradient_checkpointing=False,
                  expandable_segments=True, micro_batch=1, grad_accum=2, max_pixels=1024 * 32 * 32),
        tower_graph=False,
        samples={"packed: one 16-frame video": dict(video_frames=16, video_max_pixels=128 * 32 * 32,
                                                    packed_text=4096),
                 "packed: one 1024x1024 image": dict(image_sizes=("1024x1024",), packed_text=4096)},
        assumed="a pack of 4096 tokens holding the mix's largest visual: a 16-frame video at VIDEO_MAX_TOKEN_NUM 128 "
                "(131,072 px a frame) or one image at IMAGE_MAX_TOKEN_NUM 1024 (1,048,576 px), text filling the "
                "rest; vit_gradient_checkpointing false, expandable segments, ZeRO-2 on 2 GPUs"),
    "qwen-vl-finetune-qwen2.5vl32b-needs-8x80G": dict(
        model="qwen2.5-vl-32b-instruct", gpu="a100-80gb", gpus=8, sharding="zero3", counter="fits",
        stack="qwen-vl-finetune (transformers' Trainer + DeepSpeed ZeRO-3)",
        plan=dict(method="full", precision="bf16", optimizer="adamw_torch", gradient_checkpointing=True,
                  attn_impl="flash_attention_2", train_projector=True, max_pixels=576 * 28 * 28, micro_batch=1,
                  grad_accum=4, seq_len=2048),
        samples={"one image at 451,584 px": dict(image_sizes=("896x504",))},
        assumed="the README's max_pixels 576x28x28; sft_32b.sh is not in the stored index, so ZeRO-3, batch 1, "
                "2048 text tokens, tower frozen and merger trained (tune_mm_mlp) are assumed"),
}


def stack_difference(point: dict) -> str:
    """What the point's stack does that the advisor's plan (transformers' Trainer + peft + DeepSpeed) does not."""
    s = point["stack"].lower()
    if "megatron" in s:
        return ("Megatron-SWIFT: tensor / expert / sequence parallelism (TP shards each layer's weights and "
                "activations, EP the experts), full recompute, fused cross-entropy, packed sequences; no advisor knob "
                "for TP/EP/SP")
    if "unsloth" in s:
        return ("Unsloth: its own fused kernels and offloaded ('unsloth') gradient checkpointing (activations to "
                "the CPU), 4-bit base")
    if "minicpm" in s:
        return ("MiniCPM-V's finetune.py (transformers' Trainer + DeepSpeed ZeRO-2, or ZeRO-3 with optimizer and "
                "parameter offload): expressible (--sharding, --offload zero3_cpu) once the model is catalogued")
    if "llava" in s:
        return "LLaVA's train.py (transformers' Trainer + ZeRO-3); a fits-on-40 GB claim"
    if "videollama" in s:
        return "VideoLLaMA2's scripts; approximate values, LoRA rank, length and checkpointing not stated"
    if "internvl" in s:
        return "InternVL's internvl_chat_finetune.py + ZeRO-1"
    if "device_map" in s:
        return "a naive device_map pipeline (layers split over 8 cards in one process): no advisor knob for it"
    if "sequence parallel" in s or point.get("sequence_parallel_degree"):
        return "ms-swift sequence parallelism (Ulysses, size 4) over the text model; no advisor knob for it"
    return "ms-swift on transformers' Trainer: expressible once the model is catalogued"


def catalog_status(point: dict) -> str:
    """Whether the point's model (its hub id, the first word of the JSON's ``model``) is in the catalog."""
    from advisor.core.catalog import resolve_model

    hub_id = point["model"].split()[0]
    try:
        return f"catalogued ({resolve_model(hub_id).name})"
    except Exception:  # noqa: BLE001 - the catalog's unknown-model error
        return f"{hub_id} is not in the catalog"


def _plan(spec: dict, sample: dict, model):
    """The advisor Plan of one sample of the point (a packed sequence filled to its length)."""
    from advisor.core.plan import Plan
    from advisor.core.vision_tokens import count_sample

    fields = {**spec["plan"], **{k: v for k, v in sample.items() if k not in ("packed", "packed_text")}}
    if "packed" in sample:  # as many (image + text) samples as fill the pack, each image its own
        length, size, text = sample["packed"]
        one = count_sample(model, Plan(**{**fields, "image_sizes": (size,), "seq_len": 1})).tokens
        n = length // (one + text)
        fields.update(image_sizes=(size,) * n, seq_len=length - n * one)
    if "packed_text" in sample:  # the visual of the pack, text filling the rest
        tokens = count_sample(model, Plan(**{**fields, "seq_len": 1})).tokens
        fields["seq_len"] = sample["packed_text"] - tokens
    return Plan(**fields)


def predict(spec: dict, sample: dict) -> dict:
    """The closed form's run peak (nvidia-smi) and reserved peak (max_memory_reserved) of one sample, per GPU."""
    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.memory.overhead import outside_allocator_bytes
    from advisor.memory.sharding import shard_report
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    model, gpu = resolve_model(spec["model"]), resolve_gpu(spec["gpu"])
    plan = _plan(spec, sample, model)
    problems = plan.problems()
    if problems:
        raise SystemExit(f"{spec['model']}: the plan breaks a rule: {problems[0]}")
    rep = get_backend("estimate").measure(model, plan, gpu)
    if spec["gpus"] > 1:
        rep = shard_report(rep, model, plan, spec["gpus"], spec["sharding"], gpu)
    rep = with_phases(model, plan, gpu, rep)
    vis = rep.extra.get("vision") or {}
    peak = rep.run_peak_bytes
    return dict(plan=plan, peak=peak, reserved=peak - outside_allocator_bytes(gpu), phase=rep.run_peak_phase,
                fits=peak <= gpu.memory_bytes, card=gpu.name, transient=rep.device.get("transient", 0),
                step_phase=rep.peak_phase, lm_seq=vis.get("language_model_seq_len", plan.seq_len), vision=vis)


def short(plan) -> str:
    """The plan's short form, a packed sequence's many images counted (img49x400x100)."""
    text = plan.short()
    if len(plan.image_sizes) > 2:
        text = text.replace("img" + "+".join(plan.image_sizes), f"img{len(plan.image_sizes)}x{plan.image_sizes[0]}")
    return text


def published(point: dict) -> tuple[float | None, str]:
    m = point.get("per_gpu_memory") or {}
    v, unit = m.get("value"), (m.get("unit") or "")
    if isinstance(v, (int, float)) and unit in UNITS:
        return v * UNITS[unit], f"{v:g} {unit}"
    return None, point.get("memory_semantics") or str(v)


def compare(points: list[dict]) -> tuple[list[str], list[str], list[float]]:
    """The table's rows, the assumption notes and the A/B points' ratios (each range's ends)."""
    rows, notes, ratios = [], [], []
    for p in points:
        spec = EXPRESSED.get(p["id"])
        if spec is None:
            continue
        pub_bytes, pub_text = published(p)
        got = {label: predict(spec, s) for label, s in spec["samples"].items()}
        first = next(iter(got.values()))
        plan_text = f"{short(first['plan'])}, " + (f"{spec['gpus']} GPUs {spec['sharding']}" if spec["gpus"] > 1
                                                    else "1 GPU")
        seqs = ", ".join(f"{lab}: LM seq {g['lm_seq']}" for lab, g in got.items())
        unit = GiB if "GiB" in pub_text else GB
        un = "GiB" if unit == GiB else "GB"
        pred = "; ".join(f"{g['reserved'] / unit:.1f} / {g['peak'] / unit:.1f}" for g in got.values())
        if spec["counter"] == "fits":
            fits = all(g["fits"] for g in got.values())
            verdict = "agrees (fits)" if fits else "disagrees (does not fit)"
            n = spec["gpus"]
            pred = "; ".join(f"run peak {g['peak'] / GB:.1f} GB of {g['card']} per GPU of {n} (its transients "
                             f"{g['transient'] / GB:.1f} GB)" for g in got.values())
        else:
            rs = [g["reserved"] / pub_bytes for g in got.values()]
            ss = [g["peak"] / pub_bytes for g in got.values()]
            verdict = (f"{min(rs):.2f}-{max(rs):.2f}x (reserved), {min(ss):.2f}-{max(ss):.2f}x (smi)"
                       if len(rs) > 1 else f"{rs[0]:.2f}x (reserved), {ss[0]:.2f}x (smi)")
            if p["grade"] in ("A", "B"):
                ratios += rs
        swift = spec["counter"] == "swift"
        counter = "script comment: max_memory_reserved or nvidia-smi" if swift else "fits / OOM"
        rows.append(f"| {p['id']} | {p['grade']} | {spec['model']} | {plan_text} ({seqs}) | {counter} | {pub_text} | "
                    f"{pred}{' ' + un if swift else ''} | {verdict} |")
        notes.append(f"- `{p['id']}` ({spec['stack']}): {spec['assumed']}. Samples: "
                     + "; ".join(f"{lab} -> peak in {g['phase']}, the tower's saved activations "
                        f"{g['vision'].get('saved_activations', 0) / GiB:.2f} GiB" for lab, g in got.items()) + "."
                     + ("" if spec.get("tower_graph", True) else
                        " ms-swift 3.10 calls the tower's disable_input_require_grads() under "
                        "vit_gradient_checkpointing false, so this stack saves none of those tower activations: the "
                        "reserved figure less them is "
                        + ", ".join(f"{(g['reserved'] - g['vision'].get('saved_activations', 0)) / GiB:.1f}"
                                    for g in got.values()) + " GiB (not the advisor's answer: it has no knob for it)."))
    return rows, notes, ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "vlm_vs_published.md"))
    args = ap.parse_args(argv)
    points = json.loads(DATA.read_text())["vlm"]
    rows, notes, ratios = compare(points)
    all_a = [p for p in points if p["grade"] == "A"]
    graded_a = [p for p in all_a if p["id"] in EXPRESSED]
    other_a = ", ".join(sorted({p["stack"] for p in all_a if p not in graded_a}))
    today = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    lines = [
        "# Vision-language fine-tuning memory: the advisor against published runs", "",
        f"Generated {today} (UTC) by `python benchmarks/vlm_vs_published.py` over `{DATA}` (`vlm`, "
        f"{len(points)} points; grades A measured with the configuration stated, B a detail unstated, C a claim or "
        "ambiguous). The advisor is the "
        "closed form (estimate backend, sharded per GPU by advisor.memory.sharding, the run's phases attached). "
        f"{len(EXPRESSED)} points are expressed; every other point is listed below with what differs.", "",
        "## Compared", "",
        "Predicted: `reserved / nvidia-smi` per GPU at each assumed sample (a range over the samples): reserved is "
        "the run peak less the CUDA context and cuBLAS workspace (ms-swift's log `memory(GiB)` is "
        "torch.cuda.max_memory_reserved), nvidia-smi adds them back. Ratio: predicted / published.", "",
        "| point | grade | model | plan as the advisor reads it | counter | published | predicted | ratio / verdict |",
        "|---|---|---|---|---|---|---|---|", *rows, ""]
    if ratios:
        worst = max(ratios, key=lambda r: abs(r - 1) if r >= 1 else abs(1 / r - 1))
        lines += [f"Summary over the expressed A/B points with a number ({len(ratios)} range ends, reserved counter): "
                  f"median {statistics.median(ratios):.2f}x, worst {worst:.2f}x, range "
                  f"{min(ratios):.2f}-{max(ratios):.2f}x. Grade-A points expressed: {len(graded_a)} of "
                  f"{len(all_a)} (the others' stacks: {other_a}).",
                  ""]
    lines += ["Assumptions of the compared points:", "", *notes, "",
              "## Not compared", "",
              "| point | grade | model | stack | published | why not |", "|---|---|---|---|---|---|"]
    for p in points:
        if p["id"] in EXPRESSED:
            continue
        why = WHY_NOT.get(p["id"]) or f"{catalog_status(p)}; {stack_difference(p)}"
        if p["grade"] == "C" and p.get("grade_reason"):
            why += f" (C: {p['grade_reason']})"
        lines.append(f"| {p['id']} | {p['grade']} | {p['model'][:50]} | {p['stack'][:50].replace('|', '/')} | "
                     f"{published(p)[1].replace('|', '/')} | {why} |")
    lines += ["", *STACK_SECTIONS, "", "### For reference only (not compared)", "", *reference_lines(points)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


# Not compared (another stack): what the advisor says for the nearest transformers' Trainer run, shown beside the
# Megatron-SWIFT figure for reference only (not in the summary, nothing fitted).
REFERENCE = {
    "swift-megatron-qwen2.5vl7b-lora-2x23GiB": dict(
        model="qwen2.5-vl-7b-instruct", gpu="a100-80gb", gpus=2, sharding="ddp", counter="swift", stack=SWIFT,
        plan=dict(SWIFT_LORA, attn_impl="flash_attention_2", packing=True, loss="fused-linear", max_pixels=BUDGET_1M,
                  micro_batch=1, grad_accum=2),
        samples={"packed: 400x100 crops": dict(packed=(2048, "400x100", 110))},
        assumed="DDP on 2 GPUs for TP1/DP2, packed 2048 tokens of LaTeX_OCR samples (400x100 + ~110 text), every "
                "layer checkpointed for recompute full, the fused loss for cross_entropy_loss_fusion"),
}


def reference_lines(points: list[dict]) -> list[str]:
    out = []
    for p in points:
        spec = REFERENCE.get(p["id"])
        if spec is None:
            continue
        g = predict(spec, next(iter(spec["samples"].values())))
        pub_bytes, pub_text = published(p)
        out.append(f"- `{p['id']}` (grade {p['grade']}, published {pub_text}): the nearest transformers' Trainer "
                   f"plan `{short(g['plan'])}` ({spec['assumed']}) predicts {g['reserved'] / GiB:.1f} GiB reserved, "
                   f"{g['peak'] / GiB:.1f} GiB nvidia-smi ({g['reserved'] / pub_bytes:.2f}x): a reference, not a "
                   "comparison (Megatron's distributed optimizer, fp32 main gradients and TE kernels are not this "
                   "plan's).")
    return out


WHY_NOT = {
    "swift-qwen3vl30b-a3b-lora-zero3-2x42GiB":
        "catalogued (qwen3-vl-30b-a3b-instruct), but the closed form has no router / expert terms for "
        "qwen3_vl_moe_text: the estimate backend hands it to the simulation, not run here (slow on a shared CPU); "
        "the liger loss would be --loss fused-linear",
    "unsloth-issue1390-llama3.2-11b-vision-bs8-15GB":
        "catalogued (llama-3.2-11b-vision), but its cross-attention layers are answered by the simulation, not the "
        "closed form; and Unsloth (its kernels, offloaded checkpointing) is another stack; a user report (C)",
    "swift-qwen2.5vl3b-full-dpo-sp4-4x25GiB":
        "DPO of Qwen2.5-VL-3B under ms-swift's sequence parallelism (size 4): the advisor has no sequence-parallel "
        "knob (and its DPO plan has no image terms checked against the simulation); max_length and pixels at defaults",
    "swift-qwen3vl235b-a22b-lora-devicemap-8x70GiB":
        "Qwen3-VL-235B-A22B is not in the catalog; a device_map pipeline over 8 cards has no advisor knob",
    "hf-cookbook-smolvlm-instruct-qlora-dora-L4-residual":
        "SmolVLM-Instruct (Idefics3) is not in the catalog; the counter is the residual after training, not a peak",
    "internvl2.5-8b-lora-2gpu-recipe":
        "no memory number (a recipe's GPU count); InternVL2.5-8B (InternLM2.5 LLM) is not in the catalog "
        "(InternVL3-8B-hf is)",
}

STACK_SECTIONS = [
    "## Reading it", "",
    "- The single-GPU LoRA points are weights-dominated: the bf16 7B base is most of each prediction, and the frozen, "
    "checkpointed tower adds little at COCO or handwriting sizes, so the pixel budget barely moves them; the packed "
    "and video points are where the tower's sequence and the language model's longer sequence show.",
    "- A script comment is the peak over a whole run of samples of varying size (max_memory_reserved only grows, "
    "and the allocator's cache fragments across shapes); the advisor's figure is one step at the assumed sample. "
    "That, and whether the comment is nvidia-smi, are the likeliest parts of the under-prediction (not measured "
    "here).",
    "",
    "## What each stack does differently", "",
    "### ms-swift (`swift sft`, transformers' Trainer)", "",
    "- `freeze_vit` / `freeze_aligner` default true: `--target_modules all-linear` is built by a regex over the "
    "language model only, so the advisor's `--lora-targets all-linear` with the tower frozen (LoRA on the language "
    "model only) is the same set.",
    "- `gradient_checkpointing` defaults to true and `vit_gradient_checkpointing` (None) follows it: ms-swift "
    "checkpoints the tower's blocks (dynamic_gradient_checkpointing) and calls the tower's "
    "`enable_input_require_grads()`, so even a frozen tower records its graph, checkpointed (swift/llm/train/sft.py "
    "at 0950b0c92 and a3db5c8fd). The plans set `--vision-gradient-checkpointing`. With `vit_gradient_checkpointing "
    "false` (qwen3vl4b mixed, 06a8f59f2) ms-swift calls the tower's `gradient_checkpointing_disable()` and "
    "`disable_input_require_grads()` (swift/trainers/mixin.py), and transformers 4.x's `enable_input_require_grads` "
    "hooks the language model's embeddings only: the frozen tower then records nothing. "
    "The advisor follows transformers 5 (every sub-model's input embeddings hooked) and counts the frozen tower's "
    "saved activations whenever `--gradient-checkpointing` is on: an over-count for that point's stack.",
    "- Its log's `memory(GiB)` is torch.cuda.max_memory_reserved (no CUDA context); a script comment may be that or "
    "nvidia-smi. Both figures are shown; the summary uses reserved.",
    "- Stale comments: a script's comment was measured at the commit that wrote it; later commits changed the model "
    "(Qwen2-VL -> Qwen2.5-VL), max_length (2048 -> 4096) or MAX_PIXELS under the same comment. Each compared point "
    "uses the configuration at the comment's commit (its `source.provenance_note`), never HEAD's.",
    "- `swift sft` computes token accuracy from the logits (an argmax over the vocabulary) beside the loss; no "
    "advisor term, small next to the logits.",
    "",
    "### Megatron-SWIFT", "",
    "Tensor parallelism shards every layer's weights, gradients and activations over TP ranks, expert parallelism "
    "the experts over EP ranks, sequence parallelism the norms' and dropouts' activations; full recompute, fused "
    "cross-entropy, packed sequences and Megatron's distributed optimizer. The advisor plans data parallelism "
    "(DDP, ZeRO-2/3, FSDP) only: the two grade-A points of this list (Qwen2.5-VL-7B full at TP2, 2 x 72 GiB; LoRA "
    "at TP1/DP2, 2 x 23 GiB) are Megatron-SWIFT runs and are not compared.",
    "",
    "### Unsloth", "",
    "FastVisionModel: its own fused kernels, 4-bit base with `finetune_vision_layers`, and 'unsloth' gradient "
    "checkpointing that offloads each layer's saved input to the CPU; the issue thread reports Qwen2-VL OOMs at "
    "batch 1 on the same card. Not the advisor's stack, and Llama-3.2-Vision's cross-attention is answered by the "
    "simulation only.",
    "",
    "### MiniCPM-V, LLaVA, InternVL, VideoLLaMA2, qwen-vl-finetune", "",
    "Their own training scripts on transformers' Trainer + DeepSpeed (MiniCPM: ZeRO-3 with optimizer and parameter "
    "offload; LLaVA: ZeRO-3), with models the catalog lacks (MiniCPM-Llama3-V 2.5, LLaVA-1.5, VideoLLaMA2, "
    "InternVL2.5). The catalog is not extended for this report. qwen-vl-finetune runs a catalogued model "
    "(Qwen2.5-VL-32B) and its requirement claim is checked as a bound.",
    "",
    "### What looked off in the advisor", "",
    "- The ZeRO-3 bound (Qwen2.5-VL-32B full on 8 x 80 GB) failed on the optimizer step's transient until "
    "2026-12-07 (run peak 104.2 GB): advisor.memory.sharding kept foreach AdamW's sqrt(exp_avg_sq) of the whole model "
    "(2 bytes a parameter) on every GPU; each rank steps its own partition, and the sharded ledger now divides it.",
    "- A frozen tower under `--gradient-checkpointing` records its graph (transformers 5's "
    "`enable_input_require_grads` hooks the tower's patch embedding); under transformers 4.x without ms-swift's ViT "
    "hook it records nothing. The plan cannot say which transformers release it runs on.",
    "",
    "### Models not in the catalog", "",
    "Qwen3-VL-235B-A22B, GLM-4.6V-Flash, InternVL3.5-30B-A3B, MiniCPM-V-4, Ovis2.5-2B, DeepSeek-VL2-tiny, "
    "Keye-VL-1.5-8B, DeepSeek-OCR, Qwen2.5-Omni-7B, MiniCPM-Llama3-V 2.5, VideoLLaMA2-7B, LLaVA-1.5 7B/13B, "
    "SmolVLM-Instruct, InternVL2.5-8B.",
]

if __name__ == "__main__":
    raise SystemExit(main())
