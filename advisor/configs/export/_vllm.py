"""Export a serving plan: the `vllm serve` command line and the matching transformers generation settings.

The flags written here were checked against vLLM's documented CLI (docs.vllm.ai "Engine Arguments" and
vllm/engine/arg_utils.py, vllm/config/cache.py, vllm/model_executor/layers/quantization/__init__.py);
tests/data/vllm_serve_flags.yaml keeps that list with its sources and tests/test_serve_export.py holds
every exported flag and value to it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from advisor.core.catalog import ModelSpec
from advisor.memory.ledger import LABELS
from advisor.search.serve_grid import Candidate
from advisor.memory.inference import ServePlan

KV_FLAG = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}
"""--kv-cache-dtype: auto = the model dtype (vllm/config/cache.py CacheDType); fp8 = fp8_e4m3 on CUDA."""
DTYPE_FLAG = {"bf16": "bfloat16", "fp16": "float16"}


def served_checkpoint(model: ModelSpec, plan: ServePlan):
    """The published pre-quantized checkpoint the plan serves (advisor/data/serving_checkpoints.yaml), or None: a
    16-bit checkpoint (bf16, fp16, fp8, gpt-oss's MXFP4 as shipped) or one the user makes (make_checkpoint_lines)."""
    from advisor.core.serving_checkpoints import CHECKPOINT_FORMATS, published_checkpoint

    if plan.weight_format not in CHECKPOINT_FORMATS:
        return None
    return published_checkpoint(model.hf_id, plan.weight_format, plan.quant_method)


def needs_made_checkpoint(model: ModelSpec, plan: ServePlan) -> bool:
    from advisor.core.serving_checkpoints import CHECKPOINT_FORMATS

    return plan.weight_format in CHECKPOINT_FORMATS and served_checkpoint(model, plan) is None


def served_model_id(model: ModelSpec, plan: ServePlan) -> str:
    """What MODEL points at: the published checkpoint, the folder make_checkpoint_lines writes, or the model."""
    found = served_checkpoint(model, plan)
    if found:
        return found.hf_id
    if needs_made_checkpoint(model, plan):
        return f"./{model.hf_id.split('/')[-1]}-{SCHEME[plan.weight_format]}"
    return model.hf_id


SCHEME = {"int4": "W4A16", "int8": "W8A16"}
"""llm-compressor's weight-only presets (compressed_tensors QuantizationScheme presets; W4A16: int4, group 128)."""


def quantization_flag(model: ModelSpec, plan: ServePlan) -> str | None:
    """--quantization for the plan's weight format (vllm QUANTIZATION_METHODS).

    fp8: dynamic per-channel FP8 from a 16-bit checkpoint (``fp8``); int4 from a published AWQ or GPTQ checkpoint:
    the Marlin kernels (``awq_marlin`` / ``gptq_marlin``); int4 or int8 from a checkpoint made with llm-compressor:
    its compressed-tensors format (``compressed-tensors``); mxfp4: none, vLLM reads the checkpoint's own
    ``quantization_config`` (gpt-oss's config.json: quant_method mxfp4) and picks its MXFP4 MoE kernel by card
    (vllm-project/recipes OpenAI/GPT-OSS.md)."""
    if plan.weight_format == "int4" and served_checkpoint(model, plan) is not None:
        return f"{plan.quant_method}_marlin"
    return {"bf16": None, "fp16": None, "fp8": "fp8", "int8": "compressed-tensors", "mxfp4": None,
            "int4": "compressed-tensors"}[plan.weight_format]


def checkpoint_lines(model: ModelSpec, plan: ServePlan) -> list[str]:
    """The script's comments on the checkpoint MODEL must be: the published one, or the commands that make it
    (llm-compressor's one-shot GPTQ at the W4A16 / W8A16 preset, as vLLM's docs "Quantization: INT4 W4A16" show)."""
    found = served_checkpoint(model, plan)
    if found:
        return [f"# {plan.weight_format} weights: the published "
                f"{plan.quant_method.upper() if plan.weight_format == 'int4' else ''}"
                f" checkpoint {found.hf_id} (group size {found.group_size}, from its config.json)".replace("  ", " ")]
    if not needs_made_checkpoint(model, plan):
        return []
    scheme, out = SCHEME[plan.weight_format], served_model_id(model, plan)
    # a vision-language model's tower stays 16-bit, as vLLM's ledger holds it (serve_priors.yaml vision.tower_format)
    tower = [f"re:{model.vision.tower_path}.*"] if model.vision else []
    ignored = ", ".join(f'"{n}"' for n in ["lm_head", *tower])
    return [f"# {plan.weight_format} weights need a checkpoint in that format, and none of {model.hf_id} is listed "
            "(advisor/data/serving_checkpoints.yaml). Make one once with llm-compressor (pip install llmcompressor;",
            "# calibration on 512 samples, a GPU with room for the 16-bit model), then this script serves it:",
            f"#   python -c 'from llmcompressor import oneshot; from llmcompressor.modifiers.quantization import "
            f"GPTQModifier; oneshot(model=\"{model.hf_id}\", dataset=\"open_platypus\", recipe=GPTQModifier("
            f"targets=\"Linear\", scheme=\"{scheme}\", ignore=[{ignored}]), output_dir=\"{out}\", "
            "max_seq_length=2048, num_calibration_samples=512)'"]


def moe_notes(model: ModelSpec, plan: ServePlan) -> list[str]:
    """What serving a mixture of experts on one GPU means for the `vllm serve` line (comments of the script)."""
    if not model.is_moe:
        return []
    moe = model.moe
    lines = [f"# a mixture of experts: all {moe.num_experts} experts of every routed layer are resident (top-"
             f"{moe.experts_per_token} run per token); the ledger counts them all",
             "# --enable-expert-parallel is not set: vLLM's expert parallelism spreads the experts over the GPUs of "
             "tensor/data parallelism (EP size = TP x DP, docs.vllm.ai serving/expert_parallel_deployment); on one "
             "GPU there is nothing to spread"]
    if plan.weight_format == "mxfp4":
        lines.append("# experts stay MXFP4 as the checkpoint ships them (no --quantization: vLLM reads its "
                     "quantization_config; Marlin MXFP4 MoE on Ampere, Triton on Hopper, FlashInfer on Blackwell: "
                     "vllm-project/recipes OpenAI/GPT-OSS.md)")
    elif plan.weight_format in ("bf16", "fp16"):
        from advisor.memory.inference import ships_mxfp4_experts

        if ships_mxfp4_experts(model):
            lines.append("# bf16 experts: the published checkpoint ships MXFP4 experts, which vLLM would serve as "
                         "MXFP4; set MODEL to a bf16 copy of the weights")
    return lines


VISION_ROWS = ("vision_weights", "vision_constants", "encoder_cache", "vision_activations")


def vision_notes(model: ModelSpec, plan: ServePlan) -> list[str]:
    """What a vision-language plan's multimodal flags mean (comments of the script)."""
    v = plan.vision
    if model.vision is None or v is None:
        return []
    if not v.enabled:
        return ["# text only: --limit-mm-per-prompt 0 for every modality, so vLLM plans no image memory "
                "(docs.vllm.ai configuration/conserving_memory)"]
    return [f"# a prompt holds {' + '.join(map(str, v.image_tokens_per_image)) or 0} image tokens"
            f"{f' and {v.video_tokens} video tokens' if v.video_tokens else ''} of its {plan.context_len:,}; vLLM "
            f"profiles the encoder at its largest item ({v.item_tokens:,} tokens, {v.item_patches:,} patches)"
            + ("" if v.processor_kwargs else ": pass --max-pixels to bound it")]


def vllm_args(model: ModelSpec, cand: Candidate) -> dict[str, Any]:
    """The `vllm serve` flags of a plan, in order."""
    plan = cand.plan
    args: dict[str, Any] = {
        "--dtype": DTYPE_FLAG.get(plan.weight_format, "bfloat16"),
        "--gpu-memory-utilization": f"{cand.gpu_memory_utilization:.2f}",
        "--max-model-len": plan.context_len,
        "--max-num-seqs": plan.concurrency,
        "--max-num-batched-tokens": plan.batched_tokens,
        "--kv-cache-dtype": KV_FLAG[plan.kv_dtype],
        "--block-size": plan.block_size,
    }
    q = quantization_flag(model, plan)
    if q:
        args["--quantization"] = q
    args.update(multimodal_args(model, plan))
    return args


def multimodal_args(model: ModelSpec, plan: ServePlan) -> dict[str, str]:
    """A vision-language model's multimodal flags: ``--limit-mm-per-prompt`` as JSON (docs.vllm.ai "Engine
    Arguments": ``--limit-mm-per-prompt '{"image": 16, "video": 2}'``; vllm/config/multimodal.py
    ``MultiModalConfig.limit_per_prompt``), the images and video a prompt holds, 0 for a modality not served: vLLM
    then plans no memory for it ("disable unused modalities completely by setting its limit to zero", docs.vllm.ai
    configuration/conserving_memory "Multi-modal input limits"), and with every limit 0 it skips the encoder's
    profiling and cache (encoder_cache_manager.py ``compute_mm_encoder_budget``: "All non-text modalities ...
    explicitly disabled via limit_mm_per_prompt. Encoder cache will not be initialized."); and the pixel bounds given,
    ``--mm-processor-kwargs '{"max_pixels": ...}'`` (the overrides vLLM passes to the HF processor: Engine Arguments
    ``--mm-processor-kwargs``), which bound the largest item vLLM profiles."""
    v = plan.vision
    if model.vision is None or v is None:
        return {}
    out = {"--limit-mm-per-prompt": v.limit_mm_per_prompt()}
    kwargs = v.mm_processor_kwargs()
    if kwargs:
        out["--mm-processor-kwargs"] = kwargs
    return out


def vllm_script(model: ModelSpec, cand: Candidate) -> str:
    plan, rep = cand.plan, cand.report
    gib = 2**30
    kv = rep.kv_cache
    kv_how = (f"{plan.concurrency} x {kv.bytes_per_sequence:,} B per {plan.context_len:,}-token sequence, by layer kind"
              if set(model.description.attention_kinds()) != {"full"} else
              f"{kv.tokens_in_flight:,} tokens x {kv.bytes_per_token:,} B")
    lines = [
        "#!/usr/bin/env bash",
        f"# Serve {model.name} with vLLM: {plan.short()}  (advisor tune --task inference)",
        f"# ledger (estimated): weights {rep.device['weights'] / gib:.2f} GiB"
        f" + constants {rep.device['quant_constants'] / gib:.2f} + KV cache {rep.device['kv_cache'] / gib:.2f}"
        f" ({kv_how})"
        f" + activations {rep.device['transient'] / gib:.2f} + CUDA graphs {rep.device['cuda_graphs'] / gib:.2f}"
        + "".join(f" + {LABELS[k].lower()} {rep.device[k] / gib:.2f}" for k in VISION_ROWS if k in rep.device)
        + f" + overhead {rep.device['overhead'] / gib:.2f} = {rep.peak_bytes / gib:.2f} GiB",
        f"# vLLM may use gpu_memory_utilization x total = {cand.limit_bytes / gib:.2f} GiB; it gives the KV cache "
        "all of it that weights and activations leave, so capacity is at least the plan's.",
        *moe_notes(model, plan),
        *vision_notes(model, plan),
        "set -euo pipefail",
    ]
    lines += checkpoint_lines(model, plan)
    lines.append(f'MODEL="${{MODEL:-{served_model_id(model, plan)}}}"')
    parts = ['exec vllm serve "$MODEL"'] + [f"  {k} {shlex.quote(str(v))}" for k, v in vllm_args(model, cand).items()]
    parts.append('  "$@"')
    lines.append(" \\\n".join(parts))
    return "\n".join(lines) + "\n"


def generation_settings(model: ModelSpec, cand: Candidate) -> dict[str, Any]:
    """transformers GenerationConfig fields for the same plan (static cache of concurrency x context)."""
    plan = cand.plan
    return {"cache_implementation": "static", "max_new_tokens": plan.new_tokens, "do_sample": False,
            "use_cache": True}


def transformers_settings(model: ModelSpec, cand: Candidate, gpu=None) -> dict[str, Any]:
    """The same plan with transformers' generate(): its static cache is not paged and holds K/V in the model
    dtype, so the batch is the largest that fits the same memory (search.serve_grid.largest_static_batch), not
    vLLM's concurrency."""
    from advisor.search.serve_grid import largest_static_batch

    plan = cand.plan
    batch = largest_static_batch(model, plan, gpu, cand.limit_bytes)
    notes = [f"StaticCache preallocates batch_size x max_cache_len tokens of K and V in every layer: {batch} x "
             f"{plan.context_len:,} fits the {cand.limit_bytes / 2**30:.2f} GiB vLLM may use, against vLLM's "
             f"{plan.concurrency} paged sequences"]
    if batch == 0:
        notes[0] = (f"one {plan.context_len:,}-token static cache does not fit {cand.limit_bytes / 2**30:.2f} GiB "
                    "with transformers: serve with vLLM, or shorten max_cache_len")
    if plan.kv_dtype == "fp8":
        notes.append("transformers' static cache stores K/V in the model dtype: the fp8 KV cache is vLLM-only "
                     "(batch_size above is sized for the model dtype)")
    if plan.weight_format in ("int4", "int8", "fp8"):
        notes.append(f"load a {plan.weight_format} checkpoint (its quantization_config is read from config.json)")
    if plan.weight_format == "mxfp4":
        notes.append("transformers keeps MXFP4 experts only with triton and the kernels package on a capable GPU; "
                     "otherwise it dequantizes them to bf16 at load (quantizers/quantizer_mxfp4.py): the weights "
                     "then take the bf16 ledger's size")
    attn = "sdpa" if model.supports_attention("sdpa") else (model.description.attn_implementation or "eager")
    return {"model": served_model_id(model, plan), "dtype": "bfloat16", "attn_implementation": attn,
            "batch_size": batch, "max_cache_len": plan.context_len,
            "max_prompt_tokens": plan.prompt_len, "generation_config": generation_settings(model, cand),
            "notes": notes}


def export_serving(model: ModelSpec, cand: Candidate, out_dir: str | Path, extra: dict | None = None,
                   gpu=None) -> dict[str, Path]:
    """Write serve_vllm.sh, vllm_args.json, generation_config.json, transformers_serving.json, plan.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / n for k, n in (("vllm_script", "serve_vllm.sh"), ("vllm_args", "vllm_args.json"),
                                     ("generation_config", "generation_config.json"),
                                     ("transformers", "transformers_serving.json"), ("plan", "plan.json"))}
    paths["vllm_script"].write_text(vllm_script(model, cand), encoding="utf-8")
    paths["vllm_script"].chmod(0o755)
    paths["vllm_args"].write_text(json.dumps({"model": served_model_id(model, cand.plan),
                                              "args": vllm_args(model, cand)}, indent=2) + "\n")
    paths["generation_config"].write_text(json.dumps(generation_settings(model, cand), indent=2) + "\n")
    paths["transformers"].write_text(json.dumps(transformers_settings(model, cand, gpu), indent=2) + "\n")
    paths["plan"].write_text(json.dumps({**cand.to_dict(), **(extra or {})}, indent=2, default=str) + "\n")
    return paths
