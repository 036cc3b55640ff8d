"""`advisor tune --task inference`: the serving plan for a model on a memory budget, and its exports."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace


# flags of `advisor tune` that belong to the training study machinery, and why inference refuses them
STUDY_FLAGS = {
    "trials": ("--trials", "every plan of the serving grid is scored in closed form (a few hundred, in "
                           "milliseconds); there are no trials to count"),
    "storage": ("--storage", "the serving search keeps no Optuna study to store or resume"),
    "study": ("--study", "the serving search keeps no Optuna study to name"),
    "no_work": ("--no-work", "the serving search keeps no study for `advisor worker`s to share"),
    "tui": ("--tui", "the Textual app browses an Optuna study and the serving search keeps none; use --json or "
                     "the printed table"),
    "gpus": ("--gpus", "serving plans are for one GPU (no tensor-parallel ledger yet)"),
    "weights": ("--weights", "the serving search trains nothing: the finalists' quality runs are for training plans"),
    "quality_tokens": ("--quality-tokens", "the serving search trains nothing"),
}


SERVE_SAMPLE_KNOBS = ("image_sizes", "video_frames", "video_seconds", "max_pixels", "min_pixels", "video_max_pixels",
                      "video_total_pixels", "video_fps", "max_frames")
"""The knobs of a prompt's images and video (the training side's flags, advisor.core.plan): the serving workload of a
vision-language model (advisor.memory.serve_vision), not knobs of a training search."""


def serve_sample(args: argparse.Namespace):
    """The Plan holding a prompt's images and video as the flags give them (``--image-size`` repeatable, the pixel
    bounds, the video flags), validated; each a one-line input error naming its flag."""
    from advisor.core.plan import Plan, parse_image_size

    values = {}
    for name in SERVE_SAMPLE_KNOBS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "image_sizes":
            value = tuple(parse_image_size(v) for v in (value if isinstance(value, list) else [value]))
        values[name] = value
    return Plan(**values).validate()


def _vision_summary(model, plan, report) -> dict | None:
    """The ``vision`` object of the output: a prompt's images as the processor counts them, the context they take,
    and vLLM's multimodal terms of the chosen plan (advisor.memory.serve_vision)."""
    vision = plan.vision
    if vision is None:
        return None
    from advisor.memory.serve_vision import encoder_budget, items_per_batch

    compute, cache = encoder_budget(vision, plan.batched_tokens)
    out = vision.to_dict()
    out.update({
        "context_len": plan.context_len, "text_tokens_per_prompt": plan.context_len - vision.tokens,
        "encoder_compute_budget": compute, "encoder_cache_size": cache,
        "profiled_items": items_per_batch(vision, plan.batched_tokens, plan.context_len, plan.concurrency),
        "ledger": {k: report.device.get(k, 0) for k in ("vision_weights", "vision_constants", "encoder_cache",
                                                          "vision_activations")},
        "profile": report.extra.get("vision_profile"),
        "tower": {"class": model.vision.tower_class, "blocks": model.vision.depth, "width": model.vision.hidden_size,
                  "params": model.vision.tower_params, "projector_params": model.vision.projector_params},
    })
    return out


def refuse_study_flags(args: argparse.Namespace) -> None:
    """A flag `tune --task inference` does not support is an input error naming it, never silently ignored."""
    from advisor.core.errors import AdvisorInputError

    for attr, (flag, why) in STUDY_FLAGS.items():
        value = getattr(args, attr, None)
        if value not in (None, False) and not (attr == "gpus" and value == 1):
            raise AdvisorInputError(flag, f"not supported with --task inference: {why}", value)
    if getattr(args, "backend", "auto") in ("cpu", "cuda"):
        raise AdvisorInputError("--backend", "not supported with --task inference: the serving plan is estimated "
                                "and checked by simulation (auto, simulate or estimate)", args.backend)


def _simulate_check(model, cand, gpu) -> dict:
    """Cross-check the transformers (static cache) ledger against a fake-tensor trace of the same generation step,
    at the batch the transformers export asks for (bf16 weights: the trace runs the 16-bit model code). It checks
    the ledger's terms, not the budget; vLLM's own pool is not simulated (vLLM does not run here)."""
    from advisor.runtime.simulate.inference import trace_serving_extrapolated
    from advisor.memory.inference import estimate_inference
    from advisor.search.serve_grid import largest_static_batch

    if model.vision is not None:  # the trace builds a causal LM from the config; a tower is not traced
        return {"engine": "hf (transformers generate, static cache, bf16)", "skipped": True,
                "what": f"{model.vision.model_class} is a vision-language model: the fake-tensor serving trace "
                        "builds text models only (AutoModelForCausalLM); the vision terms are estimated"}
    batch = largest_static_batch(model, cand.plan, gpu, cand.limit_bytes)
    plan = replace(cand.plan, weight_format="bf16", kv_dtype="bf16", concurrency=max(batch, 1))
    est = estimate_inference(model, plan, None, engine="hf")
    sim = trace_serving_extrapolated(model, plan)
    est_peak = est.tensor_peak_bytes
    return {"engine": "hf (transformers generate, static cache, bf16)", "plan": plan.short(),
            "batch": plan.concurrency, "context_len": plan.context_len,
            "what": "the transformers ledger's terms against a fake-tensor trace of the same step (bf16 weights); "
                    "not a check of vLLM's pool, which is not simulated",
            "estimated_tensor_peak_bytes": est_peak, "simulated_peak_bytes": sim.peak_bytes,
            "simulated_ledger": sim.prefill.ledger, "relative_error": (est_peak - sim.peak_bytes) / sim.peak_bytes,
            "seconds": round(sim.seconds, 2)}


def run_inference(args: argparse.Namespace) -> int:
    from advisor.commands.common import target_from_args
    from advisor.core.errors import AdvisorInputError
    from advisor.core.fit import HEADROOM
    from advisor.search.serve_grid import search
    from advisor.search.serve_select import select
    from advisor.search.serve_space import load_serve_space
    from advisor.memory.inference import vllm_memory_utilization

    from advisor.memory.serve_vision import check_context, serve_vision

    sample = serve_sample(args)
    target = target_from_args(args, budget_required=True)
    model, gpu, assumed, budget = target.model, target.gpu, target.gpu_assumed, target.budget
    vision = serve_vision(model, sample)
    space_ref = args.space if getattr(args, "space", "default") not in (None, "default") else "inference"
    space = load_serve_space(space_ref, getattr(args, "overrides", None) or [])
    ctx, conc = getattr(args, "context_len", None), getattr(args, "concurrency", None)
    if ctx is not None and model.max_position_embeddings and ctx > model.max_position_embeddings:
        raise AdvisorInputError("--context-len", f"longer than {model.name}'s maximum context "
                                f"{model.max_position_embeddings}", ctx)
    if ctx is not None:
        check_context(vision, ctx)
    headroom = getattr(args, "headroom", HEADROOM)
    # vLLM may use gpu_memory_utilization x total = the budget less the headroom (rounded down): the same
    # feasibility rule as training (advisor.core.fit)
    util = vllm_memory_utilization(budget.bytes, gpu.memory_bytes, headroom)
    if util <= 0:
        raise AdvisorInputError("--gpu-budget", "leaves nothing for vLLM after the headroom", budget.text)
    limit = int(util * gpu.memory_bytes)
    cands = search(model, space, gpu, limit, util, context_len=ctx, concurrency=conc, vision=vision)
    if not any(c.fits for c in cands):
        smallest = min(cands, key=lambda c: c.report.peak_bytes)
        raise AdvisorInputError(
            "--gpu-budget", f"no serving plan fits: the smallest, {smallest.plan.short()}, needs "
            f"{budget.format(smallest.report.peak_bytes)} (estimated) and vLLM may use {budget.format(limit)} "
            f"(gpu_memory_utilization {util:.2f} of {gpu.name})", budget.text)
    selection = select(cands, space.fixed["quality_floor"], space.fixed["tie_tolerance"])
    best = selection.best
    check = None
    if best is not None and getattr(args, "backend", "auto") in ("auto", "simulate"):
        check = _simulate_check(model, best, gpu)
    exports = {}
    if best is not None and getattr(args, "export", None):
        from advisor.configs.export._vllm import export_serving

        paths = export_serving(model, best, args.export,
                               extra={"model": model.name, "gpu": gpu.name, "budget": budget.text,
                                      "simulation_check": check}, gpu=gpu)
        exports = {k: str(v) for k, v in paths.items()}
    result = {
        "task": "inference", "model": model.summary(),
        "gpu": {"name": gpu.name, "memory_bytes": gpu.memory_bytes, "assumed": assumed},
        "budget": {"bytes": budget.bytes, "text": budget.text}, "headroom": headroom,
        "gpu_memory_utilization": util, "limit_bytes": limit, "space": space.to_dict(),
        "best": best.to_dict() if best else None,
        "kv_cache_bytes_per_token": best.report.kv_cache.bytes_per_token if best else None,
        "kv_cache_bytes_per_sequence": best.report.kv_cache.bytes_per_sequence if best else None,
        "tokens_in_flight": best.report.kv_cache.tokens_in_flight if best else None,
        "explanation": selection.explanation, "rejected": selection.rejected,
        "pareto": [c.to_dict() for c in selection.pareto[:12]],
        "n_candidates": len(cands), "simulation_check": check, "exports": exports,
    }
    if model.vision is not None:
        result["vision"] = _vision_summary(model, best.plan, best.report) if best else None
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2, default=str))
    else:
        _print(result, budget)
    return 0 if best is not None else 1


def _print(result: dict, budget) -> None:
    gib = 2**30
    g = result["gpu"]
    print(f"serving {result['model']['name']} on {g['name']}{' (assumed from the budget)' if g['assumed'] else ''}, "
          f"budget {result['budget']['text']}: vLLM may use {result['limit_bytes'] / gib:.2f} GiB "
          f"(--gpu-memory-utilization {result['gpu_memory_utilization']:.2f})")
    best = result["best"]
    if best is None:
        print(f"no plan: {result['explanation']}")
        return
    print(f"best: {result['explanation']}")
    print("ledger (estimated, vLLM):")
    for k, v in best["ledger"].items():
        print(f"  {k:<18} {v / gib:8.2f} GiB")
    plan = best["plan"]
    print(f"  {'total':<18} {best['peak_bytes'] / gib:8.2f} GiB  "
          f"(KV {plan['concurrency']} x {result['kv_cache_bytes_per_sequence']:,} B per {plan['context_len']:,}-token "
          "sequence)")
    print("pareto front (served tokens, tokens/s predicted, quality prior):")
    for c in result["pareto"][:8]:
        print(f"  {c['plan_short']:<48} {c['served_tokens']:>9,}  {c['tokens_per_s']:>8,.0f}  {c['quality']:.3f}")
    if result.get("vision"):
        v = result["vision"]
        print(f"images per prompt: {', '.join(map(str, v['image_tokens_per_image'])) or 'none'} tokens "
              f"({v['vision_tokens']:,} tower patches); {v['text_tokens_per_prompt']:,} text tokens left of the "
              f"{v['context_len']:,}-token context; limit_mm_per_prompt {json.dumps(v['limit_mm_per_prompt'])}")
    if result["simulation_check"] and result["simulation_check"].get("skipped"):
        print(f"ledger check skipped: {result['simulation_check']['what']}")
    elif result["simulation_check"]:
        s = result["simulation_check"]
        print(f"ledger check, transformers generate() at the exported batch {s['batch']} x {s['context_len']:,} tokens "
              f"(bf16 weights): estimate {s['estimated_tensor_peak_bytes'] / gib:.2f} GiB vs fake-tensor trace "
              f"{s['simulated_peak_bytes'] / gib:.2f} GiB ({s['relative_error']:+.2%}); vLLM's pool is not simulated")
    for k, v in result["exports"].items():
        print(f"  wrote {k}: {v}")
