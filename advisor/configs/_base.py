"""What every format module shares: the Plan → library vocabulary, writing files, and reading them back.

A Plan speaks the advisor's language (precision ``mixed_bf16``, quantization ``nf4``); the files speak
the libraries' (``torch_dtype: float32`` + ``bf16: true``, ``load_in_4bit``). The translation lives
here once, in both directions, so every format's writer and reader agree. Reading: ``load_mapping``
(safe YAML / JSON only), ``detect_format`` and ``Collect``, which records every problem with the key
it was found at, and the keys a file left out, all at once.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from advisor.core.dtypes import TORCH_NAMES
from advisor.configs.formats import FORMATS
from advisor.core.errors import AdvisorInputError
from advisor.core.optimizers import optimizer_aliases
from advisor.core.plan import ALL_LINEAR

if TYPE_CHECKING:
    from advisor.core.catalog import GpuSpec, ModelSpec
    from advisor.core.plan import Plan

DEEPSPEED_FILE = FORMATS["deepspeed"].filename
ZERO_OFFLOAD_STAGES = {"zero2_cpu": 2, "zero3_cpu": 3}
"""The Plan's CPU offload → its DeepSpeed ZeRO stage."""
ZERO_SHARDING_STAGES = {"zero2": 2, "zero3": 3}
"""A several-GPU sharding strategy (advisor.memory.sharding) → its DeepSpeed ZeRO stage."""

TORCH_DTYPE = dict(TORCH_NAMES)
"""Plan dtype names → torch dtype names (what BitsAndBytesConfig and from_pretrained take)."""
TORCH_TO_PLAN = {**{v: k for k, v in TORCH_DTYPE.items()}, **{k: k for k in TORCH_DTYPE},
                 "half": "fp16", "float": "fp32", **{f"torch.{v}": k for k, v in TORCH_DTYPE.items()}}
"""Every way a file names a dtype → the Plan's name."""

# precision → (dtype the weights are loaded in, TrainingArguments.bf16, TrainingArguments.fp16).
# Pure bf16/fp16: weights in that dtype, autocast a no-op. Mixed: fp32 weights, autocast to 16 bit.
PRECISION_FLAGS = {
    "bf16": ("bfloat16", True, False),
    "fp16": ("float16", False, True),
    "fp32": ("float32", False, False),
    "mixed_bf16": ("float32", True, False),
    "mixed_fp16": ("float32", False, True),
}
FLAGS_PRECISION = {v: k for k, v in PRECISION_FLAGS.items()}


def precision_from_flags(weights: str, bf16: bool, fp16: bool) -> str | None:
    """The precision of weights in the Plan dtype ``weights`` under the bf16 / fp16 autocast flags (None:
    not one the advisor plans). 16-bit weights without either flag train in their own dtype (pure)."""
    hit = FLAGS_PRECISION.get((TORCH_DTYPE[weights], bf16, fp16))
    if hit is None and weights != "fp32" and not (bf16 or fp16):
        return weights
    return hit


OPTIM_ALIASES = optimizer_aliases()
"""The optimizer names files use (TrainingArguments.optim and the tools' own) → the Plan's: each declared name
as itself, and its aliases (advisor/data/optimizers.yaml)."""
HF_OPTIM_DEFAULT = "adamw_torch_fused"
"""TrainingArguments.optim's default in transformers 5."""

# Defaults a person would start from; the advisor sizes memory, it does not tune these.
STARTING_LEARNING_RATE = {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}
"""The learning rate an exported run starts from, per method: LoRA/QLoRA papers and peft examples use
1e-4..3e-4; full fine-tuning of 1-10B models 1e-5..5e-5."""
RL_LEARNING_RATE = {"full": 1e-6, "lora": 1e-5, "qlora": 1e-5}
"""The learning rate an exported GRPO/DPO run starts from: GRPOConfig's and DPOConfig's default 1e-6 for a full
fine-tune (trl/trainer/grpo_config.py, dpo_config.py); 1e-5 for adapters, TRL's PEFT examples' (docs: "GRPO with
PEFT", "DPO ... LoRA")."""
LR_SCHEDULER = "cosine"
WARMUP_STEPS = 10
"""An integer: transformers 5 dropped ``warmup_ratio`` (a float ``warmup_steps`` is its ratio
now) while 4.x only takes integers here, so a whole number of steps runs on both."""
ADAM = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0}
"""TrainingArguments' own defaults, written out because the DeepSpeed optimizer section repeats them."""


def training_hyperparameters(plan: "Plan") -> dict[str, Any]:
    """learning_rate, max_grad_norm and optim_args an exported run trains with: AdamW's starting values, or the
    ones the sources of a plan's optimizer recommend where it changes training dynamics (LOMO, AdaLomo, GaLore,
    APOLLO, SGD, a step inside backward: advisor.search.quality.recommended_hyperparameters, cited in
    advisor/data/quality.yaml), with ``why`` and ``sources`` then (the header says them)."""
    from advisor.search.quality import recommended_hyperparameters

    from advisor.core.plan import RL_TASKS

    # a GRPO / DPO run starts lower (TRL's defaults, RL_LEARNING_RATE): every file of one export says the same rate
    # (deepspeed.json's optimizer block too: transformers refuses a pair that differs)
    start = RL_LEARNING_RATE if plan.task in RL_TASKS else STARTING_LEARNING_RATE
    out: dict[str, Any] = {"learning_rate": start[plan.method], "max_grad_norm": ADAM["max_grad_norm"]}
    rec = recommended_hyperparameters(plan)
    for key in ("learning_rate", "max_grad_norm", "optim_args", "why", "sources"):
        if key in rec:
            out[key] = rec[key]
    return out


def hyperparameter_note(plan: "Plan") -> list[str]:
    """Header lines saying why an export's learning rate or clipping differ from AdamW's ([] when they don't)."""
    hp = training_hyperparameters(plan)
    if "why" not in hp:
        return []
    lines = [f"learning_rate {hp['learning_rate']:g} and max_grad_norm {hp['max_grad_norm']:g} (AdamW's: "
             f"{STARTING_LEARNING_RATE[plan.method]:g} and {ADAM['max_grad_norm']:g}) because {plan.optimizer}"
             + (" with the step inside backward" if plan.optimizer_in_backward else "") + " changes training dynamics:"]
    lines += textwrap.wrap(hp["why"], width=100)
    lines += [f"source: {s}" for s in hp.get("sources", [])]
    return lines


LIGER_FUSED_LOSS_ONLY = {"fused_linear_cross_entropy": True, "cross_entropy": False, "rms_norm": False,
                         "swiglu": False, "rope": False}
"""TrainingArguments.liger_kernel_config for --loss fused-linear: only the fused linear cross-entropy (the
lever the plan models), not Liger's RMSNorm/SwiGLU/RoPE kernels (transformers Trainer passes it to
liger_kernel.transformers._apply_liger_kernel_to_instance)."""


# --------------------------------------------------------------------------- writing


class Unsupported(AdvisorInputError):
    """A format cannot express this plan (e.g. axolotl has no fp32-master mixed precision)."""

    def __init__(self, fmt: str, reason: str):
        super().__init__(f"--format {fmt}", reason, show_value=False)
        self.format = fmt


VISION_SCRIPT = "vision_setup.py"
"""The exported scripts' vision-language side (templates/vision_setup.py), written beside them."""


def vision_script_rules(ctx: "ExportContext", fmt: str, who: str = "the exported script") -> None:
    """What an export's vision-language run (the exported scripts' vision_setup.py, axolotl's multimodal path) does
    not do: video, packed or padding-free batches of image samples (each sample is the processor's, padded to the
    batch's longest)."""
    plan = ctx.plan
    if not ctx.spec.is_vision_language:
        return
    if plan.video_frames or plan.video_seconds:
        raise Unsupported(fmt, f"{who} batches images only (a video's frames are not read): export a video plan to "
                               "LLaMA-Factory")
    if plan.packing:
        raise Unsupported(fmt, f"{who} pads each batch of image samples to its longest (no packing of vision "
                               "samples): plan without --packing")


def sequence_parallel_rules(ctx: "ExportContext", fmt: str) -> None:
    """What the transformers Trainer's sequence parallelism runs on (accelerate ParallelismConfig; transformers docs,
    deepspeed_alst.md): Ulysses (sp_backend deepspeed) under a DeepSpeed engine, ring attention (torch context
    parallel, cp_size) under FSDP2 with sdpa; TRL refuses packing with context parallelism (SFTTrainer.__init__)."""
    plan = ctx.plan
    if plan.sp_degree == 1:
        return
    if plan.sp_backend == "ulysses" and ctx.zero_stage is None:
        raise Unsupported(fmt, "Ulysses sequence parallelism (accelerate sp_backend deepspeed) runs inside DeepSpeed: "
                               "use --sharding zero2 or zero3")
    if plan.sp_backend == "ring":
        if not ctx.fsdp:
            raise Unsupported(fmt, "ring attention (accelerate cp_size, torch context parallel) runs under FSDP2 "
                                   "only: use --sharding fsdp")
        if plan.attn_impl != "sdpa":
            raise Unsupported(fmt, "torch context parallel replaces sdpa's kernels only: use --attn-impl sdpa")
        if plan.packing:
            raise Unsupported(fmt, "TRL and the Trainer refuse packing with context parallelism (it drops the "
                                   "documents' mask): plan without --packing, or use --sp-backend ulysses")


def template(name: str) -> str:
    """An exported script's text: ``advisor/configs/export/templates/<name>``, copied byte for byte (what the tests run
    is what a user gets)."""
    from importlib import resources

    return resources.files("advisor.configs.export.templates").joinpath(name).read_text(encoding="utf-8")


LONG_CONTEXT_SCRIPT = "long_context_setup.py"
"""Beside an exported script of a sequence-parallel or tiled-MLP plan: accelerate's ParallelismConfig from its
section, DeepSpeed's TiledMLP on the decoder MLPs."""


def write_long_context_script(ctx: "ExportContext", out_dir: Path) -> Path | None:
    """long_context_setup.py beside the exported script, for a plan with sequence parallelism or tiled MLP (byte for
    byte the template)."""
    if ctx.plan.sp_degree == 1 and not ctx.plan.tiled_mlp:
        return None
    return write_text(out_dir / LONG_CONTEXT_SCRIPT, template(LONG_CONTEXT_SCRIPT))


def write_vision_script(ctx: "ExportContext", out_dir: Path) -> Path | None:
    """vision_setup.py beside the exported script, for a vision-language model (byte for byte the template)."""
    if not ctx.spec.is_vision_language:
        return None
    return write_text(out_dir / VISION_SCRIPT, template(VISION_SCRIPT))


@dataclass(frozen=True)
class ExportContext:
    """Everything an exporter may look at: the model, the plan, and what the advisor predicted."""

    spec: "ModelSpec"
    plan: "Plan"
    """Validated."""
    gpu: "GpuSpec | None" = None
    """The GPU the plan was sized for, if known."""
    extra: dict = field(default_factory=dict)
    """Predictions and provenance (peak_bytes, tokens_per_s, source, study, ...), copied into advisor.yaml."""
    gpus: int = 1
    """The GPUs the plan was sized for, one process each (data parallel)."""
    sharding: str | None = None
    """How the model state is split across ``gpus`` (advisor.memory.sharding.STRATEGIES; export_plan resolves
    None to its default); nothing to split on one GPU."""
    out_dir: Path | None = None
    """Where the files are written (resolved): the files name each other by absolute path, so a launch and
    each tool's parser find them from any working directory."""

    @property
    def model_id(self) -> str:
        return self.spec.hf_id

    @property
    def file_plan(self) -> "Plan":
        """The plan as a tool's own keys hold it: its sequence cap counts the planned sample's image and video tokens
        beside the text (advisor.core.vision_tokens.sequence_tokens), so the sample the memory was planned for
        passes the cap, and a pixel-budget processor's ``max_pixels`` is the planned images' (planned_pixel_budget),
        so that no larger image of the data takes more tokens than planned; the same plan for a text model."""
        from advisor.core.vision_tokens import planned_pixel_budget, sequence_tokens

        cap, budget = sequence_tokens(self.spec, self.plan), planned_pixel_budget(self.spec, self.plan)
        changes = {**({"seq_len": cap} if cap != self.plan.seq_len else {}),
                   **({"max_pixels": budget} if budget else {})}
        return self.plan.with_(**changes) if changes else self.plan

    @property
    def zero_stage(self) -> int | None:
        """The DeepSpeed ZeRO stage the run uses: its CPU offload's, else ZeRO-2/3 sharding on several GPUs."""
        if self.plan.offload in ZERO_OFFLOAD_STAGES:
            return ZERO_OFFLOAD_STAGES[self.plan.offload]
        if self.gpus > 1 and self.strategy in ZERO_SHARDING_STAGES:
            return ZERO_SHARDING_STAGES[self.strategy]
        return None

    @property
    def strategy(self) -> str:
        """How the run splits model state: the plan's offload engine, else the sharding (advisor.memory.sharding
        .run_strategy, as estimate, tune and pre-flight decide it)."""
        from advisor.memory.sharding import run_strategy

        return run_strategy(self.plan, self.sharding)

    @property
    def fsdp(self) -> bool:
        """Whether the run shards with PyTorch FSDP (several GPUs; sharding fsdp or FSDP's CPU offload)."""
        return self.zero_stage is None and self.gpus > 1 and self.strategy == "fsdp"

    @property
    def deepspeed_path(self) -> str:
        """deepspeed.json as the other files name it: its absolute path where the export has a folder."""
        return str(self.out_dir / DEEPSPEED_FILE) if self.out_dir is not None else DEEPSPEED_FILE

    def file(self, name: str) -> str:
        """A file of this export by the path that resolves from any working directory."""
        return str(self.out_dir / name) if self.out_dir is not None else name

    def launch(self, script: str, args: str = "", *, accelerate: bool = False) -> str:
        """The command that runs ``script`` as planned: one process per GPU (torchrun, or ``accelerate launch``
        for a tool that runs under accelerate), with the allocator environment before it."""
        target = f"{self.file(script)}{' ' + args if args else ''}"
        if self.gpus == 1:
            return f"{env_prefix(self.plan)}python {target}"
        if accelerate:
            return f"{env_prefix(self.plan)}accelerate launch --num_processes {self.gpus} {target}"
        return f"{env_prefix(self.plan)}torchrun --nproc_per_node {self.gpus} {target}"

    def sharding_line(self) -> list[str]:
        """A header line naming the GPUs and the sharding ([] for one GPU)."""
        if self.gpus == 1:
            return []
        if self.zero_stage is not None:
            how = f"DeepSpeed ZeRO-{self.zero_stage} ({self.file(DEEPSPEED_FILE)})"
        elif self.fsdp:
            how = "FSDP full_shard (parameters, gradients and optimizer states split" + (
                "; their shards in pinned host memory, the optimizer stepping on the CPU: CPU offload)"
                if self.plan.offload == "fsdp_cpu" else ")")
        else:
            how = "DDP (every GPU holds the whole model state)"
        return [f"GPUs: {self.gpus}, one process each; sharding: {how}"]


Writer = Callable[[ExportContext, Path], Path]


def lora_alpha_value(alpha: float) -> int | float:
    """Whole-number alphas as ints (LoraConfig types it int; axolotl and LLaMA-Factory demand it)."""
    return int(alpha) if float(alpha).is_integer() else float(alpha)


def require_int_alpha(fmt: str, plan) -> int | None:
    if not plan.peft:
        return None
    value = lora_alpha_value(plan.lora_alpha)
    if not isinstance(value, int):
        raise Unsupported(fmt, f"its lora_alpha is a whole number; the plan has {plan.lora_alpha}")
    return value


def dump_yaml(data: dict, header: str) -> str:
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
    return header.rstrip("\n") + "\n\n" + body


def comment_block(lines: list[str]) -> str:
    return "\n".join(("# " + line).rstrip() for line in lines) + "\n"


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2) + "\n")


def alloc_env(plan) -> dict[str, str]:
    """Environment the run needs for the plan's allocator settings: PYTORCH_CUDA_ALLOC_CONF
    (advisor.memory.allocator.AllocatorConfig.to_env; torch reads it when CUDA starts)."""
    from advisor.memory.allocator import AllocatorConfig

    conf = AllocatorConfig(expandable_segments=plan.expandable_segments).to_env()
    return {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}


def env_prefix(plan) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF=... `` to put before a launch command ('' when none is needed)."""
    return "".join(f"{k}={v} " for k, v in alloc_env(plan).items())


def env_note(ctx: "ExportContext", filename: str) -> list[str]:
    """Header lines for a format with no field for environment variables, when the plan needs one: set it in the
    shell that launches the file, and in the one that checks it (advisor preflight reads the shell's value, as
    torch does: advisor.configs.read)."""
    if not alloc_env(ctx.plan):
        return [f"Check: {check_command(ctx, filename)}"] if ctx.gpus > 1 else []
    return [f"{filename} has no field for environment variables: PYTORCH_CUDA_ALLOC_CONF (the plan's",
            "allocator setting) must be set in the shell that launches it, as above, and that checks it:",
            f"Check: {env_prefix(ctx.plan)}{check_command(ctx, filename)}"]


def fsdp_refusal(ctx: "ExportContext", why: str) -> str:
    """Why a format cannot write the plan's FSDP run, and the way out: the formats that can, or ZeRO-3 where the plan's
    sharding (not its offload) chose FSDP."""
    what = "FSDP's CPU offload" if ctx.plan.offload == "fsdp_cpu" else "FSDP sharding"
    other = "" if ctx.plan.offload == "fsdp_cpu" else ", or --sharding zero3"
    return f"{what} {why}: use the advisor.yaml + train.py or trl.yaml export{other}"


def check_command(ctx: "ExportContext", filename: str) -> str:
    """The pre-flight of an exported file on the run it was sized for: the card where one was named, and the GPU count
    of a several-GPU run (a format that cannot hold it: advisor preflight --gpus; the sharding the file says itself)."""
    gpu = f" --gpu {ctx.gpu.key}" if ctx.gpu is not None and not ctx.gpu.detected else ""
    gpus = f" --gpus {ctx.gpus}" if ctx.gpus > 1 else ""
    return f"advisor preflight {ctx.file(filename)}{gpu}{gpus} --gpu-budget <GB>"


def fsdp_offloads(fsdp: Any, fsdp_config: Any) -> bool:
    """Whether TrainingArguments' FSDP settings offload to the CPU: the legacy ``fsdp`` option's ``offload`` (a string
    or a list) or ``fsdp_config.cpu_offload`` (transformers training_args.py ``_apply_legacy_fsdp_to_config``)."""
    items = fsdp.split() if isinstance(fsdp, str) else list(fsdp or []) if isinstance(fsdp, (list, tuple)) else []
    return "offload" in items or bool(isinstance(fsdp_config, dict) and fsdp_config.get("cpu_offload"))


def plan_summary(ctx: ExportContext) -> list[str]:
    """Header lines naming the model, the plan and the prediction."""
    lines = [f"model: {ctx.spec.name} ({ctx.spec.hf_id})", f"plan:  {ctx.plan.short()}"]
    if ctx.gpu is not None:
        lines.append(f"sized for: {ctx.gpu.name} ({ctx.gpu.memory_bytes / 2**30:.1f} GiB)"
                     + (f" x {ctx.gpus}" if ctx.gpus > 1 else ""))
    lines += ctx.sharding_line()
    peak = ctx.extra.get("peak_bytes")
    if peak:
        src = ctx.extra.get("source", "predicted")
        phase = ctx.extra.get("peak_phase")
        step = f" during {phase} (the training step: {ctx.extra['step_peak_bytes'] / 2**30:.2f} GiB)" \
            if phase and ctx.extra.get("step_peak_bytes") else ""
        lines.append(f"peak memory ({src}): {peak / 2**30:.2f} GiB{step}")
    return lines + hyperparameter_note(ctx.plan)


FSDP_OPTION = "full_shard auto_wrap"
"""TrainingArguments.fsdp for the fsdp strategy: parameters, gradients and optimizer states sharded
(advisor.memory.sharding), each decoder layer its own unit (auto_wrap: the model's ``_no_split_modules``)."""


def fsdp_config(plan) -> dict[str, Any]:
    """TrainingArguments.fsdp_config (transformers docs, FSDP): one layer gathered at a time with the next one
    prefetched, as the per-GPU ledger counts it; ``use_orig_params`` so LoRA's frozen and trainable weights share
    a unit; the weights loaded on rank 0 only and broadcast (``cpu_ram_efficient_loading``)."""
    return {"backward_prefetch": "backward_pre", "forward_prefetch": True, "use_orig_params": bool(plan.peft),
            "cpu_ram_efficient_loading": True, "sync_module_states": True,
            "activation_checkpointing": False}  # checkpointing stays TrainingArguments.gradient_checkpointing


def parallel_fields(ctx: "ExportContext") -> dict[str, Any]:
    """The TrainingArguments keys of a several-GPU run: ``deepspeed`` (by absolute path) under ZeRO, ``fsdp`` and
    ``fsdp_config`` under FSDP, nothing for DDP (torchrun's processes are the data parallelism)."""
    if ctx.zero_stage is not None:
        return {"deepspeed": ctx.deepspeed_path}
    if ctx.fsdp:
        offload = " offload" if ctx.plan.offload == "fsdp_cpu" else ""  # TrainingArguments: fsdp_config cpu_offload
        return {"fsdp": FSDP_OPTION + offload, "fsdp_config": fsdp_config(ctx.plan)}
    return {}


# --------------------------------------------------------------------------- reading

def load_mapping(path: str | Path) -> dict[str, Any]:
    """The file as a dict: JSON for .json, YAML (safe_load) otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise AdvisorInputError("CONFIG", f"cannot read {p} ({e.strerror})", str(p), show_value=False) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise AdvisorInputError("CONFIG", f"{p} is not valid JSON ({e.msg} at line {e.lineno})", str(p),
                                show_value=False) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise AdvisorInputError("CONFIG", f"{p} is not valid YAML{where}", str(p), show_value=False) from None
    if not isinstance(data, dict):
        raise AdvisorInputError("CONFIG", f"{p} must hold a mapping of keys to values", str(p), show_value=False)
    return data


def detect_format(data: dict[str, Any]) -> str:
    """The format of a file's mapping, by the declarations' ``detect`` (advisor.configs.formats)."""
    from advisor.configs.formats import detect_format as detect

    return detect(data)


class Collect:
    """Reads values, records each problem with its key, and what was defaulted."""

    def __init__(self, base_dir: Path):
        self.errors: list[AdvisorInputError] = []
        self.defaulted: list[str] = []
        self.base_dir = base_dir

    def bad(self, where: str, rule: str, value: Any) -> None:
        self.errors.append(AdvisorInputError(where, rule, value))

    def section(self, data: dict, key: str, where: str | None = None) -> dict | None:
        value = data.get(key)
        if value is None or value == {}:
            return None
        if not isinstance(value, dict):
            self.bad(where or key, "must be a mapping of keys to values (or null)", value)
            return None
        return value

    def get(self, data: dict, key: str, where: str, kind: str, default: Any = None, *, record: bool = True) -> Any:
        if key not in data or data[key] is None:
            if record and default is not None:
                self.defaulted.append(where)
            return default
        value = data[key]
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                self.bad(where, "must be a whole number", value)
                return default
            return int(value)
        if kind == "num":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                try:
                    return float(str(value))
                except ValueError:
                    self.bad(where, "must be a number", value)
                    return default
            return value
        if kind == "bool":
            if not isinstance(value, bool):
                self.bad(where, "must be true or false", value)
                return default
            return value
        if kind == "str":
            if not isinstance(value, str) or not value:
                self.bad(where, "must be a non-empty string", value)
                return default
            return value
        return value

    def expert_parameters(self, value: Any, where: str, example: str = "experts.gate_up_proj") -> bool:
        """Whether a config's peft ``target_parameters`` list puts LoRA on stacked experts (lora_experts)."""
        if value is not None and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            self.bad(where, f"must be a list of parameter names ({example}, ...)", value)
        return bool(value)

    def choice(self, value: Any, table: dict[str, str], where: str) -> str | None:
        if value is None:
            return None
        key = str(value).strip()
        if key not in table:
            self.bad(where, f"must be one of {', '.join(dict.fromkeys(table))}", value)
            return None
        return table[key]

    def targets(self, value: Any, where: str, *, comma: bool = False) -> tuple[str, ...] | str | None:
        if value is None:
            return None
        if isinstance(value, str):
            if value.strip() in (ALL_LINEAR, "all"):
                return ALL_LINEAR
            from advisor.core.adapters import names_of_language_model_regex

            names = names_of_language_model_regex(value)  # a vision-language model's language-model targets
            if names:
                return names
            if comma or value.replace("_", "").replace(",", "").replace(" ", "").isalnum():
                names = tuple(t.strip() for t in value.split(",") if t.strip())
                if names:
                    return names
            self.bad(where, f"a regular expression is not supported here: list the module names or {ALL_LINEAR}",
                     value)
            return None
        if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) and t for t in value):
            return tuple(value)
        self.bad(where, f"must be a list of module names or {ALL_LINEAR}", value)
        return None


Read = Callable[[dict, Collect, type], "tuple[str | None, dict, dict]"]
"""A format's reader: (the file's mapping, the collector, the Plan class) → (model, Plan fields, extras)."""
