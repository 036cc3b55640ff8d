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
from advisor.core.plan import DTYPE_BYTES, Plan
from advisor.memory.sharding import DEFAULT_SHARDING
from advisor.memory.training import ParamBreakdown, param_breakdown, trainable_dtype_bytes


@lru_cache(maxsize=1)
def constants() -> dict[str, Any]:
    """name -> value of ``throughput.yaml`` (the sources stay in the file and in ``constant_entries``)."""
    return {name: entry["value"] for name, entry in constant_entries().items()}


@lru_cache(maxsize=1)
def constant_entries() -> dict[str, dict[str, Any]]:
    """name -> {value, fitted, source} as written in ``throughput.yaml``."""
    return load_data_file("throughput.yaml")


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
        self.sharding = sharding
        self.k = k if k is not None else constants()
        self.stack = stack or {}
        """Differences of another software stack than the one the advisor exports (used by the
        published-runs benchmark only, each stated there): ``adapter_bytes`` (2023 peft kept
        LoRA weights in the base dtype, no input cast), ``loss_bytes_per_vocab`` (older
        transformers copied the shifted fp32 logits); and ``attention_scale`` (packed documents'
        attention against one full-length sequence, set from a data profile)."""

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
