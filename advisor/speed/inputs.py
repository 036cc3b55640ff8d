"""What every step-time term reads: the model, the plan, the GPU, the constants, and the rates and
shapes several terms share, computed once per prediction.

Rates are the GPU's datasheet figures (``advisor/data/gpus.yaml``) times the efficiencies of
``advisor/data/throughput.yaml``. Nothing here imports torch.
"""

from __future__ import annotations

from functools import cached_property, lru_cache
from typing import Any

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.data_files import load_data_file
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.knobs import knob_of
from advisor.core.plan import DTYPE_BYTES, Plan
from advisor.memory.sharding import DEFAULT_SHARDING, run_strategy
from advisor.memory.training import ParamBreakdown, param_breakdown, trainable_dtype_bytes
from advisor.speed.layers import LayerKind, adapted_linears, layer_kinds, plan_adapts_experts


@lru_cache(maxsize=1)
def constants() -> dict[str, Any]:
    """name -> value of ``throughput.yaml`` (the sources stay in the file and in ``constant_entries``)."""
    return {name: entry["value"] for name, entry in constant_entries().items()}


LEVER_ROWS = {"optimizer_bytes_per_param": "optimizer", "attention_efficiency": "attn_impl"}
"""Constants with one row per value of a Plan lever (constant -> knob): every value the knob declares needs its own
row, and none borrows another's (``lever_row``)."""


@lru_cache(maxsize=1)
def constant_entries() -> dict[str, dict[str, Any]]:
    """name -> {value, fitted, source} as written in ``throughput.yaml``, its per-lever tables checked."""
    entries = load_data_file("throughput.yaml")
    errs = lever_row_problems(entries)
    if len(errs) == 1:
        raise errs[0]
    if errs:
        raise ConfigErrors(errs)
    return entries


def lever_row_problems(entries: dict[str, dict[str, Any]], plan_type: type = Plan) -> list[AdvisorInputError]:
    """Every value of a lever with no row in its table of ``LEVER_ROWS``, and every row for no value."""
    errs = []
    for name, lever in LEVER_ROWS.items():
        rows, values = entries[name]["value"], knob_of(plan_type, lever).choices
        flag = knob_of(plan_type, lever).flag
        errs += [AdvisorInputError(f"throughput.yaml: {name}.{v}", f"no row: {flag} {v} needs its own step-time term",
                                   v, show_value=False) for v in values if v not in rows]
        errs += [AdvisorInputError(f"throughput.yaml: {name}.{r}", f"a row for no {flag} value (values: "
                                   f"{', '.join(values)})", r, show_value=False) for r in rows if r not in values]
    return errs


def lever_row(s: "StepInputs", name: str) -> Any:
    """The row of constant ``name`` (LEVER_ROWS) for the plan's value of its lever: a value without one is an
    error naming the flag, never another value's row."""
    lever = LEVER_ROWS[name]
    value = getattr(s.plan, lever)
    try:
        return s.k[name][value]
    except KeyError:
        raise AdvisorInputError(knob_of(type(s.plan), lever).flag, f"no step-time term (throughput.yaml {name} "
                                f"has rows for {', '.join(s.k[name])})", value) from None


@lru_cache(maxsize=512)
def _breakdown(model: ModelSpec, method: str, lora_r: int, lora_targets) -> ParamBreakdown:
    """param_breakdown depends on these fields only; the tuner ranks thousands of plans of one model."""
    return param_breakdown(model, Plan(method=method, lora_r=lora_r, lora_targets=lora_targets))


@lru_cache(maxsize=64)
def _shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    return model.linear_shapes()


class StepInputs:
    """One prediction's inputs. Terms read attributes; derived ones are computed on first use."""

    def __init__(self, model: ModelSpec, plan: Plan, gpu: GpuSpec, gpus: int = 1, sharding: str = DEFAULT_SHARDING,
                 k: dict[str, Any] | None = None, stack: dict[str, Any] | None = None):
        self.model = model
        self.plan = plan
        self.gpu = gpu
        self.gpus = gpus
        self.sharding = run_strategy(plan, sharding)  # an offload's own engine (advisor.memory.sharding)
        self.k = k if k is not None else constants()
        self.stack = stack or {}
        """Differences of another software stack than the one the advisor exports (used by the
        published-runs benchmark only, each stated there): ``adapter_bytes`` (2023 peft kept
        LoRA weights in the base dtype, no input cast), ``loss_bytes_per_vocab`` (older
        transformers copied the shifted fp32 logits), ``lora_experts`` (Megatron's all-linear LoRA adapts the
        expert GEMMs too); and ``attention_scale`` (packed documents' attention against one full-length
        sequence, set from a data profile)."""

    # ------------------------------------------------------------------ shapes
    @cached_property
    def tokens(self) -> int:
        """M: tokens in one micro-batch (padding included: the GPU computes on it)."""
        return self.plan.micro_batch * self.plan.seq_len

    @cached_property
    def pb(self) -> ParamBreakdown:
        p = self.plan
        try:
            return _breakdown(self.model, p.method, p.lora_r, p.lora_targets)
        except TypeError:  # an unhashable field (a list of targets): no cache
            return param_breakdown(self.model, p)

    @cached_property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear of one decoder layer."""
        try:
            return _shapes(self.model)
        except TypeError:
            return self.model.linear_shapes()

    @cached_property
    def kinds(self) -> tuple[LayerKind, ...]:
        """The decoder layers by kind (advisor/speed/layers.py): one for a dense model, more where attention
        kinds alternate or dense and routed layers mix."""
        return layer_kinds(self.model)

    @cached_property
    def lora_linears(self) -> tuple[str, ...]:
        """Short names of the linears that get LoRA adapters (on a mixture of experts, without the names peft
        would move to the stacked experts)."""
        return adapted_linears(self.model, tuple(self.pb.lora_modules))

    @cached_property
    def expert_lora(self) -> bool:
        """LoRA on the stacked experts (peft target_parameters): each forward folds W + s B A into one stack."""
        return self.model.is_moe and (plan_adapts_experts(self.plan) or bool(self.stack.get("lora_experts")))

    @cached_property
    def experts_train(self) -> bool:
        """The expert stacks need their weight gradient: a full fine-tune, or LoRA on the experts (the folded
        stack's gradient flows back to A and B)."""
        return self.full or self.expert_lora

    @cached_property
    def experts_path(self) -> str:
        """How this card runs transformers' grouped_mm experts (``grouped_mm_experts_forward``):

        - ``grouped``: one CUTLASS grouped GEMM over every expert, bf16 on compute capability 9.x and 10.x
          (pytorch aten/src/ATen/native/cuda/GroupedBlas.cpp ``_grouped_mm_cuda``: the fast path needs
          ``_scaled_mm_allowed_device(sm90_only, sm100_only)``);
        - ``loop``: torch's fallback, the expert offsets copied to the host (one synchronization) and one
          ``mm_out`` per expert (aten/src/ATen/native/GroupedMMUtils.h ``_grouped_mm_fallback``): sm80 to sm89 and
          sm120, fp16 and fp32 anywhere;
        - ``transformers_loop``: below sm80 transformers does not call torch's grouped_mm and loops itself, its
          backward computing the weight gradient even of frozen experts (transformers integrations/moe.py
          ``_can_use_grouped_mm``, ``_grouped_mm_fallback_bwd``).
        An unknown compute capability is taken as the grouped kernel's."""
        sm = self.gpu.sm
        if sm is not None and sm < 80:
            return "transformers_loop"
        if self.expert_dtype != "bf16" or (sm is not None and not 90 <= sm < 110):
            return "loop"
        return "grouped"

    @cached_property
    def expert_dtype(self) -> str:
        """dtype of the stacked experts: the compute dtype on a quantized base (bitsandbytes leaves them alone), else
        the parameters' (fp32 under mixed precision: grouped_mm is not autocast, transformers casts the input to
        the weight's dtype, integrations/moe.py ``_grouped_mm``)."""
        p = self.plan
        return p.compute_dtype if p.quantized else p.param_dtype

    @cached_property
    def expert_rate_scale(self) -> float:
        """The expert matmuls' rate against the activation dtype's: fp32 experts run without tensor cores
        (PyTorch keeps ``allow_tf32`` off for matmuls by default: fp32_simt_ratio)."""
        if self.expert_dtype == "fp32" and self.plan.activation_dtype != "fp32":
            return self.k["fp32_simt_ratio"]
        return 1.0

    @cached_property
    def act_bytes(self) -> int:
        """p: bytes per activation element."""
        return DTYPE_BYTES[self.plan.activation_dtype]

    @cached_property
    def trainable_bytes(self) -> int:
        return trainable_dtype_bytes(self.plan)

    @cached_property
    def adapter_bytes(self) -> int:
        """Bytes per LoRA weight element (peft >= 0.12 upcasts adapters to fp32)."""
        return int(self.stack.get("adapter_bytes", self.trainable_bytes if self.plan.peft else 0))

    @cached_property
    def full(self) -> bool:
        return self.plan.method == "full"

    @cached_property
    def checkpointed_fraction(self) -> float:
        """Share of decoder layers whose forward is recomputed in backward (0 without checkpointing).

        A plan with ``checkpoint_layers`` (k of L layers checkpointed) recomputes k/L of them."""
        if not self.plan.gradient_checkpointing:
            return 0.0
        k = getattr(self.plan, "checkpoint_layers", None)
        if k is None:
            return 1.0
        return max(0.0, min(1.0, k / self.model.num_layers))

    # ------------------------------------------------------------------ rates
    @cached_property
    def matmul_flops(self) -> float:
        """FLOP/s of large GEMMs in the activation dtype: datasheet dense peak x efficiency,
        capped by the sustained rate where the card is power-limited."""
        g = self.gpu
        peak = (g.bf16_tflops if self.plan.activation_dtype == "bf16" and g.bf16_tflops else g.fp16_tflops) or 0.0
        if self.plan.activation_dtype == "fp32":
            peak = (g.bf16_tflops or g.fp16_tflops) * self.k["fp32_tensor_ratio"]
        rate = peak * 1e12 * self.k["matmul_efficiency"]
        sustained = g.sustained_tflops
        if sustained:
            scale = 1.0 if self.plan.activation_dtype != "fp32" else self.k["fp32_tensor_ratio"]
            rate = min(rate, sustained * 1e12 * scale)
        return max(rate, 1e9)

    @cached_property
    def peak_flops(self) -> float:
        """FLOP/s of the dense tensor peak (no efficiency), capped by the sustained rate."""
        return self.matmul_flops / self.k["matmul_efficiency"]

    @cached_property
    def mem_bw(self) -> float:
        """Bytes/s streaming kernels reach."""
        return max(self.gpu.mem_bw_gbs, 1.0) * 1e9 * self.k["bandwidth_efficiency"]

    @cached_property
    def dequant_4bit_bw(self) -> float:
        """Bytes/s bitsandbytes' 4-bit dequantization moves inside a training step (fitted, see
        ``dequant_4bit_bandwidth_efficiency`` in throughput.yaml)."""
        return max(self.gpu.mem_bw_gbs, 1.0) * 1e9 * self.k["dequant_4bit_bandwidth_efficiency"]

    @cached_property
    def host_link(self) -> float:
        return max(self.gpu.host_link_gbs, 1.0) * 1e9 * self.k["host_link_efficiency"]

    @cached_property
    def interconnect(self) -> float:
        """Bytes/s of ring collectives between this GPU's peers (NVLink, else the host link)."""
        link = self.gpu.nvlink_gbs or self.gpu.host_link_gbs
        return max(link, 1.0) * 1e9 * self.k["interconnect_efficiency"]
