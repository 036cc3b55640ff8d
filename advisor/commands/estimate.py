"""`advisor estimate`: the memory ledger of a training plan or of serving."""

from __future__ import annotations

import argparse
import json

from advisor.commands._help import DefaultsHelpFormatter
from advisor.commands.common import add_host_budget_flag, add_model_flags, add_plan_flags, number, positive_int
from advisor.core.errors import AdvisorInputError
from advisor.core.fit import HEADROOM
from advisor.core.plan import SEQ_MAX
from advisor.runtime.backends import BACKENDS


def add_parser(subs) -> None:
    p = subs.add_parser(
        "estimate", help="memory ledger of a training step (or of serving)",
        description="Where the memory of one fine-tuning step (or of serving) goes, category by category.",
        formatter_class=DefaultsHelpFormatter)
    add_model_flags(p)
    add_host_budget_flag(p)
    add_plan_flags(p)
    g = p.add_argument_group("inference (--task inference)")
    g.add_argument("--context-len", type=positive_int, default=4096, help="tokens per sequence")
    g.add_argument("--concurrency", type=positive_int, default=1, help="sequences at once")
    g.add_argument("--weight-format", default="bf16", help="bf16, fp16, fp8, int8, int4")
    g.add_argument("--kv-dtype", default="bf16", help="bf16, fp16, fp8")
    p.add_argument("--data", metavar="FILE",
                   help="your training documents (JSONL with \"text\", text, or one token length per line): the "
                        "peak is that of the longest batch unless --packing")
    p.add_argument("--backend", default="estimate", choices=BACKENDS,
                   help="estimate (closed form; the simulation answers for a model it cannot describe, and the "
                        "output says so), simulate (fake-tensor trace), or a cpu / cuda probe (real run, the budget "
                        "enforced)")
    p.add_argument("--headroom", type=number(low=0, low_inclusive=True, high=1), default=HEADROOM,
                   help="fraction of the budget kept free")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from advisor.commands.common import check_plan_against_model, plan_from_args, target_from_args
    from advisor.core.card_rules import Card
    from advisor.core.fit import fits, host_fits, host_usable_bytes

    target = target_from_args(args)
    model, gpu, budget = target.model, target.gpu, target.budget
    result: dict = {"model": {**model.summary(), "source": model.source},
                    "gpu": gpu.to_dict() if gpu else None, "gpu_assumed": target.gpu_assumed, "task": args.task}
    if args.task == "inference":
        from advisor.commands._inference import serve_sample
        from advisor.memory.inference import ServePlan, estimate_inference
        from advisor.memory.serve_vision import serve_vision

        # a prompt's images (--image-size, the pixel bounds): part of the context (advisor.memory.serve_vision)
        splan = ServePlan(weight_format=args.weight_format, kv_dtype=args.kv_dtype, context_len=args.context_len,
                          concurrency=args.concurrency, vision=serve_vision(model, serve_sample(args))).validate()
        report = estimate_inference(model, splan, gpu)
        result["plan"] = splan.to_dict()
        result["kv_cache_bytes_per_token"] = report.extra["kv_cache_bytes_per_token"]
        result["kv_cache_bytes_per_sequence"] = report.extra["kv_cache_bytes_per_sequence"]
        if splan.vision is not None:
            result["vision"] = {**splan.vision.to_dict(), "profile": report.extra.get("vision_profile")}
    else:
        from advisor.runtime.backends import PROBES, BackendFailed, BackendOptions, get_backend

        seq_max = args.seq_len == SEQ_MAX
        if seq_max:
            if budget is None and target.known_gpu is not None:  # the named card's whole memory
                from advisor.core.units import parse_budget

                budget = parse_budget("100%", gpu_total_bytes=target.known_gpu.memory_bytes)
            if budget is None:
                raise AdvisorInputError("--seq-len", "max needs a budget to fit: give --gpu-budget or --gpu", "max")
            args.seq_len = None  # the plan's default length, replaced by the longest that fits below
        # the precision and attention not given are the card's; a plan it cannot run is refused (card_rules)
        plan = plan_from_args(args, card=Card.of(target.known_gpu, model))
        check_plan_against_model(model, plan)
        from advisor.memory.sequence_parallel import sequence_parallel_problems
        from advisor.memory.sharding import gpu_count_problems

        # the rules that need the GPU count, as tune checks them (a vLLM server's GPUs, GRPO's groups, FSDP's
        # offload) and sequence parallelism's
        for problem in gpu_count_problems(plan, args.gpus) + sequence_parallel_problems(model, plan, args.gpus):
            raise problem
        if getattr(args, "data", None):
            from advisor.runtime.probe import data_profile

            data = data_profile(args.data, model.path)
            data.refuse_image_flag(plan.image_sizes)
            sized = data.sized(plan, model)  # the longest batch; the largest sample's images where they carry any
            result["data"] = {**data.to_dict(), "seq_len_for_memory": sized.seq_len,
                              "real_token_fraction": data.real_token_fraction(plan.seq_len, plan.micro_batch,
                                                                              plan.packing)}
            if data.images and model.is_vision_language:
                _, _, lengths = data.largest_sample(model, plan)
                result["data"].update(largest_sample_images=list(sized.image_sizes), longest_sample_tokens=max(lengths))
                if sized.seq_len > plan.seq_len:  # a trainer would cut its text; planned whole
                    result["data"]["warning"] = (f"the longest sample holds {max(lengths):,} tokens with its images, "
                                                 f"more than --seq-len {plan.seq_len:,} text tokens beside the largest "
                                                 f"images: planned at {sized.seq_len:,}")
            plan = sized
        # a real run is held to the budget (a probe over it ends as oom)
        options = BackendOptions(budget_bytes=budget.bytes if budget and args.backend in PROBES else None)

        def measure(plan):
            """The run of ``plan``: one GPU's step (sharded over --gpus), with the run's phases."""
            from advisor.runtime.phases import with_phases

            report = get_backend(args.backend).measure(model, plan, gpu, options)
            from advisor.memory.sharding import shard_report, train_gpus

            training = train_gpus(args.gpus, plan)  # --gpus counts a vLLM server's, as tune's does
            if training > 1:
                report = shard_report(report, model, plan, training, args.sharding, gpu)
            return with_phases(model, plan, gpu, report)

        try:
            if seq_max:
                plan, result["seq_len_search"] = _longest(model, plan, budget, args.headroom, measure, args.backend)
                result["max_seq_len"] = result["seq_len_search"]["max_seq_len"]
            report = measure(plan)
        except BackendFailed as e:
            print(f"estimate: {e}", file=sys.stderr)
            return 1
        result["plan"] = plan.to_dict()
        result["plan_short"] = plan.short()
    result.update(report.to_dict())
    result.update(answered_by(model, args.task, args.backend, report))
    result["ledger"] = report.device
    if report.extra.get("task") in ("grpo", "dpo"):
        result["generation"] = report.extra.get("generation")
    if args.task != "inference" and report.extra.get("vision"):
        from advisor.memory.vision import vision_summary

        result["vision"] = vision_summary(report.extra["vision"], model, plan)
    if args.task != "inference":
        from advisor.memory.sharding import train_gpus

        result.update(throughput_fields(model, plan, gpu, target.gpu_assumed, train_gpus(args.gpus, plan),
                                        args.sharding, report))
    if budget is not None:
        result["budget"] = {"bytes": budget.bytes, "text": budget.text, "unit": budget.unit}
        result["headroom"] = args.headroom
        # the run fits when its highest phase does (load, train, eval, generate, save): the one rule
        result["fits"] = fits(report.run_peak_bytes, budget.bytes, args.headroom)
    host_budget = target.host_budget
    if host_budget is not None and args.task != "inference":
        # the host rule (advisor.core.fit.host_fits): the host peak against the RAM less the OS reserve; the
        # ranks of --gpus share one machine
        host_peak = report.host_peak_bytes * args.gpus
        result["host_budget"] = {"bytes": host_budget.bytes, "text": host_budget.text,
                                 "detected": target.host_detected,
                                 "usable_bytes": int(host_usable_bytes(host_budget.bytes))}
        result["host_fits"] = host_fits(host_peak, host_budget.bytes)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        from rich.console import Console

        from advisor.ui.render import print_estimate

        print_estimate(result, report, budget, args.headroom, host_budget=target.host_budget if args.task != "inference"
                       else None, gpus=args.gpus)
        if (result.get("data") or {}).get("warning"):
            Console().print(f"[yellow]--data: {result['data']['warning']}[/]")
        Console().print(f"[dim]answered by the {result['answered_by']}: {result['answered_by_reason']}[/]")
    return 0


def _longest(model, plan, budget, headroom: float, measure, backend: str) -> tuple:
    """``plan`` at the longest sequence that fits the budget, and the search's figures (advisor.memory.longest)."""
    from advisor.memory.longest import longest_plan

    plan, fit = longest_plan(model, plan, budget.bytes, headroom, measure, backend)
    return plan, fit.to_dict()


def answered_by(model, task: str, backend: str, report) -> dict:
    """Who answered (the closed form, the simulation or a probe) and why: ``answered_by`` and
    ``answered_by_reason`` of the output (advisor.memory.closed_form has the rule)."""
    from advisor.memory.closed_form import CLOSED_FORM, SIMULATION, closed_form_describes

    if task == "inference":
        kinds = model.description.attention_kinds()
        return {"answered_by": CLOSED_FORM,
                "answered_by_reason": "the serving ledger: weights and each layer's cache from the model's description"
                                      " (" + ", ".join(f"{k} x{n}" for k, n in kinds.items())
                                      + (", every expert resident" if model.is_moe else "") + ")"}
    handed = report.extra.get("answered_by")
    if handed:
        return {"answered_by": handed["by"], "answered_by_reason": handed["why"]}
    if report.backend == "estimate":
        return {"answered_by": CLOSED_FORM, "answered_by_reason": closed_form_describes(model)[1]}
    if report.backend == "simulate":
        return {"answered_by": SIMULATION, "answered_by_reason": f"--backend {backend}: the real model code on fake "
                                                                 "tensors"}
    return {"answered_by": f"{report.backend} probe", "answered_by_reason": f"--backend {backend}: a real run"}


def throughput_fields(model, plan, gpu, gpu_assumed: bool, gpus: int, sharding: str, report) -> dict:
    """Tokens/s and seconds per optimizer step beside the ledger (advisor/speed): predicted, or
    calibrated by earlier probes on this GPU model, or measured when the backend ran the step.

    ``gpu`` and ``gpu_assumed`` are the command's Target's (advisor.core.target: the one rule that assumes
    the catalog GPU a budget matches when none is named or detected)."""
    from advisor.speed.layers import describes as speed_describes
    from advisor.speed.throughput import predict_throughput

    if gpu is None or not (gpu.bf16_tflops or gpu.fp16_tflops):
        return {"tokens_per_s": None, "step_seconds": None, "step_terms": {},
                "throughput": {"source": "unknown: no GPU named (--gpu) or detected, no budget to assume one"}}
    describes, why = speed_describes(model)
    if not describes and (report.measured is None or not report.measured.tokens_per_s):
        # the step-time model has terms for dense and routed layers, softmax (full, sliding, latent) and Gated
        # DeltaNet attention (advisor/speed/layers.py); another layer it cannot time
        return {"tokens_per_s": None, "step_seconds": None, "step_terms": {},
                "throughput": {"source": f"not predicted: the step-time model has no term for this model ({why})"}}
    tp = predict_throughput(model, plan, gpu, gpus, sharding)
    out = {"tokens_per_s": tp.tokens_per_s, "step_seconds": tp.step_seconds, "step_terms": tp.terms,
           "throughput": {"source": tp.source, "gpu": gpu.name, "gpu_assumed": gpu_assumed, "gpus": gpus,
                          "predicted_tokens_per_s": tp.tokens_per_s}}
    if plan.task != "sft":
        from advisor.speed.throughput import rl_times

        times = rl_times(model, plan, gpu, gpus, sharding)
        out["throughput"]["phases"] = {name: {"seconds": sec, "share": times.shares[name]}
                                       for name, sec in times.phases.items()}
        out["throughput"]["tokens"] = "completion tokens" if plan.task == "grpo" else "chosen and rejected tokens"
        out["completion_tokens_per_s" if plan.task == "grpo" else "pair_tokens_per_s"] = times.completion_tokens_per_s
        if times.decode_step_seconds:
            out["throughput"]["decode_step_seconds"] = times.decode_step_seconds
    measured = report.measured.tokens_per_s if report.measured is not None else None
    if measured:
        out["tokens_per_s"] = float(measured) * gpus
        out["step_seconds"] = plan.tokens_per_step * gpus / out["tokens_per_s"]
        out["throughput"]["source"] = "measured"
    return out
