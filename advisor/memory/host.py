"""The host ledger: the host (CPU) memory of a training run, split by how the libraries really allocate it.

- **Pinned** (page-locked) memory comes from torch's CachingHostAllocator, which rounds every request up to
  a power of two (torch/include/ATen/core/CachingHostAllocator.h:302-309, ``c10::llvm::PowerOf2Ceil`` up to
  ``pinned_max_round_threshold``, unlimited by default: c10/core/AllocatorConfig.h:361) and keeps freed blocks
  for reuse. transformers' checkpoint offload (``save_on_cpu(pin_memory=True)``, torch/autograd/graph.py:400-414;
  transformers modeling_utils.py:3160-3166), TRL's OffloadActivations (trl/models/activation_offloading.py:319,
  ``empty_like(..., pin_memory=True)``), the exported train.py's offload and DeepSpeed's ``pin_memory`` (its
  accelerator calls ``tensor.pin_memory()``, deepspeed/accelerator/abstract_accelerator.py:275-339, unless
  ``DS_PIN_MEMORY_BACKEND=native``) all allocate through it, so a pinned tensor costs its power-of-two block.
- **Pageable** memory is ordinary malloc'd memory: DeepSpeed's CPU Adam moments (``torch.zeros_like`` of the
  fp32 partition, deepspeed/ops/adam/cpu_adam.py:161-164, never pinned), ZeRO-3's fp32 partition
  (stage3.py:1158-1160, a ``clone`` of a CPU tensor), and a paged optimizer's states evicted to the host:
  bitsandbytes allocates them with cudaMallocManaged (``get_paged``, bitsandbytes/functional.py); they live on
  the host only while the driver keeps them evicted (advisor.memory.training.paged_spill models how much).
- **Loading**: the exported train.py loads the model with a ``device_map`` onto its process's GPU (one tensor staged
  on the host at a time: transformers core_model_loading.py:1461-1466 ``_materialize_copy``, loaded synchronously
  when quantizing on the fly, :1862-1871), except under DeepSpeed ZeRO-2 or FSDP, which take the model from the
  CPU whole (every parameter materialized on the host, in every process), and ZeRO-3, whose ``zero.Init`` makes
  each parameter partitioned. The safetensors file itself is mapped (page cache, which the kernel reclaims) and
  is not counted.
- **The process**: Python and the training libraries (advisor/data/host_memory.yaml ``process_baseline``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from advisor.core.catalog import ModelSpec
from advisor.core.adapters import adapted_modules
from advisor.core.plan import DTYPE_BYTES, Plan
from advisor.memory.ledger import HostMemory
from advisor.memory.tensors import four_bit_constant_bytes, numel, param_shapes, trainable_shapes

DEEPSPEED_PIN_MEMORY = True
"""``offload_optimizer.pin_memory`` and ``offload_param.pin_memory`` as advisor/configs/_deepspeed.py writes
them (tests/test_host_memory.py holds the two together)."""
ZERO3_SUB_GROUP = 1_000_000_000
"""DeepSpeed's default ``sub_group_size`` (deepspeed/runtime/zero/config.py:182): ZeRO-3 splits the trainable
partition into sub-groups of about this many elements, each with its own fp32 gradient buffer."""
ZERO3_PERSISTENCE = 100_000
"""DeepSpeed's default ``stage3_param_persistence_threshold`` (zero/config.py:228): parameters of at most this many
elements stay on the GPU under ZeRO-3 (partition_parameters.py:1292, ``ds_persist``), the rest go to the host."""
OFFLOAD_MIN_BYTES = 1024
"""TRL's ``min_offload_size`` (trl/models/activation_offloading.py:128): smaller saved tensors stay on the GPU."""
SHARDED = ("optimizer_states", "master_weights", "gradients", "weights")
"""Host categories that ZeRO partitions across data-parallel ranks (activations are each rank's own)."""


def pinned_block_bytes(nbytes: int) -> int:
    """The block torch's CachingHostAllocator allocates for a pinned request of ``nbytes``: the next power of
    two (ATen/core/CachingHostAllocator.h:302-309)."""
    n = int(nbytes)
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def pinned_bytes_of(sizes: Iterable[int] | Counter) -> int:
    """Pinned blocks of tensors of these byte sizes (a Counter: size -> how many)."""
    counts = sizes if isinstance(sizes, Counter) else Counter(int(s) for s in sizes)
    return int(sum(pinned_block_bytes(s) * n for s, n in counts.items()))


@lru_cache(maxsize=1)
def process_baseline_bytes() -> int:
    """The training process before it loads weights (advisor/data/host_memory.yaml ``process_baseline``)."""
    from advisor.core.data_files import load_data_file

    return int(load_data_file("host_memory.yaml")["process_baseline"]["bytes"])


# ----------------------------------------------------------------------------- parameter tensors

def param_tensors(model: ModelSpec) -> Counter:
    """Elements of every parameter tensor of the model: numel -> how many (linears, biases, expert stacks, routers,
    norms, the embedding, an untied output head, the final norm: advisor.memory.tensors.param_shapes)."""
    return Counter(numel(s) for s in param_shapes(model))


def trainable_tensors(model: ModelSpec, plan: Plan) -> Counter:
    """Elements of every trainable tensor: LoRA's A (r x in) and B (out x r) per adapted module and layer (and
    DoRA's magnitude vector, LoRA on the expert stacks), or every parameter for a full fine-tune."""
    modules = adapted_modules(model, plan) if plan.peft else []
    return Counter(numel(s) for s in trainable_shapes(model, plan, modules))


def _sixteen_bit(plan: Plan) -> int:
    """Bytes of DeepSpeed's low-precision copy: bf16 or fp16 when the exported config enables either, else fp32
    (advisor/configs/_deepspeed.py sets ``bf16.enabled`` / ``fp16.enabled`` from the plan's precision)."""
    return 2 if plan.precision in ("bf16", "fp16", "mixed_bf16", "mixed_fp16") else 4


# ----------------------------------------------------------------------------- DeepSpeed ZeRO-Offload

@dataclass(frozen=True)
class HostBuffer:
    """One kind of host tensor DeepSpeed allocates for ZeRO-Offload."""

    name: str
    """DeepSpeed's attribute (or what it is)."""
    category: str
    """The ledger category it counts under."""
    tensors: Counter
    """Bytes of each tensor: bytes -> how many."""
    pinned: bool
    """Page-locked (then each tensor takes a power-of-two block) or pageable."""

    @property
    def nbytes(self) -> int:
        """The bytes allocated: pinned blocks, or the tensors' own bytes."""
        return pinned_bytes_of(self.tensors) if self.pinned else int(sum(k * v for k, v in self.tensors.items()))


def deepspeed_buffers(model: ModelSpec, plan: Plan, pin_optimizer: bool = DEEPSPEED_PIN_MEMORY,
                      pin_param: bool = DEEPSPEED_PIN_MEMORY) -> list[HostBuffer]:
    """The host tensors of DeepSpeed ZeRO-Offload on one rank, buffer by buffer as DeepSpeed 0.19 allocates them
    (tests/test_host_memory.py checks the ZeRO-2 list against a real DeepSpeed engine on the CPU). The HF Trainer
    hands DeepSpeed one parameter group (transformers integrations/deepspeed.py:669, ``DummyOptim``), so each flat
    partition is one tensor."""
    tensors = trainable_tensors(model, plan)
    n = sum(k * v for k, v in tensors.items())
    largest = max(tensors) if tensors else 0
    p16 = _sixteen_bit(plan)
    one = lambda nbytes: Counter({int(nbytes): 1}) if nbytes else Counter()  # noqa: E731
    # DeepSpeedCPUAdam: fp32 exp_avg and exp_avg_sq, zeros_like on the CPU: pageable (ops/adam/cpu_adam.py:161-164)
    out = [HostBuffer("exp_avg, exp_avg_sq", "optimizer_states", Counter({4 * n: 2}) if n else Counter(), False)]
    if plan.offload == "zero2_cpu":
        out += [
            # stage_1_and_2.py:560-565 the fp32 master partition, pinned by offload_optimizer.pin_memory
            HostBuffer("single_partition_of_fp32_groups", "master_weights", one(4 * n), pin_optimizer),
            # :566-575 a 16-bit copy of the partition, to send the updated weights back to the GPU
            HostBuffer("param_buffer_of_bit16_for_cpu_offload_groups", "weights", one(p16 * n), pin_optimizer),
            # :936-941 the fp32 gradient partition
            HostBuffer("single_partition_of_fp32_groups[].grad", "gradients", one(4 * n), pin_optimizer),
            # :656-658 a 16-bit staging buffer the size of the largest parameter
            HostBuffer("temp_grad_buffer_for_cpu_offload", "gradients", one(p16 * largest), pin_optimizer),
        ]
        if plan.grad_accum > 1:
            # :1822-1825, :2166 with accumulation, a 16-bit buffer per parameter, each pinned on its own
            out.append(HostBuffer("accumulated_grads_in_cpu", "gradients",
                                  Counter({p16 * k: v for k, v in tensors.items()}), pin_optimizer))
        return out
    # ZeRO-3: every parameter over the persistence threshold is partitioned to the host as it is made, each pinned
    # on its own by offload_param.pin_memory (partition_parameters.py:1836-1843)
    p_w = DTYPE_BYTES[plan.param_dtype]
    offloaded = {k: v for k, v in param_tensors(model).items() if k > ZERO3_PERSISTENCE}
    groups = Counter({ZERO3_SUB_GROUP: n // ZERO3_SUB_GROUP})
    if n % ZERO3_SUB_GROUP:
        groups[n % ZERO3_SUB_GROUP] += 1
    out += [
        HostBuffer("ds_tensor (parameter partitions)", "weights", Counter({p_w * k: v for k, v in offloaded.items()}),
                   pin_param),
        # stage3.py:906 the trainable partitions copied into one flat buffer, pinned whatever the setting; their
        # first blocks stay in torch's host cache (freed pinned blocks are kept for reuse)
        HostBuffer("param_groups_fp16_flat_cpu_memory", "weights", one(p16 * n), True),
        # stage3.py:1158-1160 the fp32 partition, a clone of a CPU tensor: pageable
        HostBuffer("fp32_partitioned_groups_flat", "master_weights", one(4 * n), False),
        # stage3.py:790-795 the flat gradient buffer in the accumulation dtype (the model's: engine.py:1806)
        HostBuffer("grad_partitions_flat_buffer", "gradients", one(p16 * n), pin_optimizer),
        # stage3.py:1338-1342 an fp32 gradient buffer per sub-group of sub_group_size elements
        HostBuffer("fp32_partitioned_groups_flat[].grad", "gradients", Counter({4 * k: v for k, v in groups.items()}),
                   pin_optimizer),
    ]
    return out


def deepspeed_host(model: ModelSpec, plan: Plan, pin_optimizer: bool = DEEPSPEED_PIN_MEMORY,
                   pin_param: bool = DEEPSPEED_PIN_MEMORY) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """(pinned, pageable, notes): ``deepspeed_buffers`` summed per category and kind."""
    pinned: dict[str, int] = {}
    pageable: dict[str, int] = {}
    for b in deepspeed_buffers(model, plan, pin_optimizer, pin_param):
        if b.nbytes:
            target = pinned if b.pinned else pageable
            target[b.category] = target.get(b.category, 0) + b.nbytes
    stage = "ZeRO-2 offload (DeepSpeed stage_1_and_2.py)" if plan.offload == "zero2_cpu" else \
        "ZeRO-3 offload (DeepSpeed stage3.py, partition_parameters.py)"
    kinds = ", ".join(f"{k} {'pinned' if v else 'pageable'}" for k, v in (
        ("optimizer buffers", pin_optimizer), *((("parameters", pin_param),) if plan.offload == "zero3_cpu" else ())))
    return pinned, pageable, [f"{stage}: {kinds} (pin_memory), CPU Adam moments pageable"]


# ----------------------------------------------------------------------------- FSDP CPU offload

def _fsdp_base_tensors(model: ModelSpec, plan: Plan) -> tuple[Counter, int]:
    """(bytes of every base parameter as FSDP2 holds it, how many weights are 4-bit): bitsandbytes 4-bit weights
    packed in their float ``bnb_4bit_quant_storage`` (n/2 bytes), a full fine-tune's parameters fp32 (accelerate
    ``fsdp2_prepare_model`` upcasts trainable parameters under mixed precision), the rest in the parameter dtype."""
    p = 4 if plan.method == "full" else DTYPE_BYTES[plan.param_dtype]
    linears = [m for layer in model.description.layers for m in layer.linears]
    packed = Counter(m.out_features * m.in_features for m in linears if plan.four_bit and m.quantized_by_bnb)
    out: Counter = Counter()
    for n, count in param_tensors(model).items():
        q = min(count, packed.get(n, 0))
        if q:
            out[n // 2] += q
        if count - q:
            out[n * p] += count - q
    return out, sum(n * c for n, c in packed.items())


def fsdp_stored_tensors(model: ModelSpec, plan: Plan) -> Counter:
    """Bytes of every parameter as FSDP2 keeps it under CPU offload (``_fsdp_base_tensors``), LoRA's adapters fp32
    (peft autocast_adapter_dtype)."""
    out, _ = _fsdp_base_tensors(model, plan)
    if plan.peft:
        out.update(Counter({4 * k: v for k, v in trainable_tensors(model, plan).items()}))
    return out


def fsdp_offload_buffers(model: ModelSpec, plan: Plan) -> list[HostBuffer]:
    """The host tensors of FSDP2's CPU offload on one rank, whole-model bytes (the caller divides the sharded
    categories among the ranks: ``SHARDED``). torch's fully_shard with ``CPUOffloadPolicy(pin_memory=True)``, as
    accelerate builds it from ``fsdp_config.cpu_offload``: each parameter's local shard pinned on the host
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, ``pin_memory()`` of the sharded data); each reduce-scattered
    gradient shard copied to the host with ``non_blocking=True`` (_fsdp_collectives.py ``foreach_reduce``), which
    allocates pinned memory; AdamW's two moments ``zeros_like`` each fp32 host parameter (torch/optim/adamw.py
    _init_group; the plan's optimizer is torch's AdamW under this offload: core.plan FSDP_OFFLOAD_OPTIMIZERS),
    pageable."""
    trainable = trainable_tensors(model, plan)
    n = sum(k * v for k, v in trainable.items())
    return [
        HostBuffer("sharded parameters (FSDPParam._sharded_param_data)", "weights", fsdp_stored_tensors(model, plan),
                   True),
        HostBuffer("sharded gradients (reduce-scatter output, copied to the host)", "gradients",
                   Counter({4 * k: v for k, v in trainable.items()}), True),
        HostBuffer("AdamW exp_avg, exp_avg_sq of the host parameters", "optimizer_states",
                   Counter({4 * n: 2}) if n else Counter(), False),
    ]


def fsdp_host_load(model: ModelSpec, plan: Plan, gpus: int) -> tuple[int, str]:
    """(host bytes per rank, what) of loading under FSDP on ``gpus`` GPUs. The exported fsdp_config sets
    ``cpu_ram_efficient_loading``: rank 0 materializes the model, the others move to the meta device and receive their
    shards (accelerate utils/fsdp_utils.py ``fsdp2_prepare_model``, ``fsdp2_load_full_state_dict``), so the node
    holds one copy, counted as 1/N of it per rank. A model with bitsandbytes 4-bit weights is skipped by that path:
    train.py quantizes it on the host (device_map cpu, bitsandbytes' CPU backend) in every process."""
    if plan.four_bit:
        base, quantized = _fsdp_base_tensors(model, plan)
        return int(sum(k * v for k, v in base.items()) + four_bit_constant_bytes(quantized, plan)), \
            "the whole 4-bit model quantized on the CPU in each process (FSDP: no rank-0 loading for 4-bit)"
    load, _ = whole_model_load(model, plan)
    return load // gpus, f"rank 0 holds the whole model on the CPU (cpu_ram_efficient_loading): 1/{gpus} of it " \
                         "per rank"


# ----------------------------------------------------------------------------- loading

def load_host_bytes(model: ModelSpec, plan: Plan) -> tuple[int, str]:
    """(host bytes, what) of loading the model as the exported train.py does (see the module docstring)."""
    p = DTYPE_BYTES[plan.param_dtype]
    largest = max(param_tensors(model)) * p
    if plan.offload == "zero3_cpu":
        # zero.Init partitions each parameter as it is made; loading gathers one module at a time
        # (transformers integrations/deepspeed.py _load_state_dict_into_zero3_model)
        return int(largest), "one tensor staged at a time (zero.Init)"
    if plan.offload == "fsdp_cpu":
        return fsdp_host_load(model, plan, 1)
    if plan.offload == "none":
        # train.py loads onto the process's own GPU (device_map={"": local rank}) unless DeepSpeed or FSDP
        # shards the run (advisor.memory.sharding.shard_report counts that load)
        return int(largest), ("one tensor staged at a time (device_map, quantized as it loads)" if plan.quantized
                              else "one tensor staged at a time (device_map onto this process's GPU)")
    return whole_model_load(model, plan)


def whole_model_load(model: ModelSpec, plan: Plan) -> tuple[int, str]:
    """Loading without a device_map (DeepSpeed ZeRO-2 / ZeRO-Offload, FSDP): every parameter materialized on the
    host in each process before the engine moves or shards it."""
    return int(model.params_total * DTYPE_BYTES[plan.param_dtype]), \
        "the whole model on the CPU (no device_map under DeepSpeed or FSDP) before it moves to the GPU"


# ----------------------------------------------------------------------------- the ledger

def host_memory(model: ModelSpec, plan: Plan, *, activations_pinned: int = 0,
                spill_bytes: int = 0, notes: Iterable[str] = ()) -> HostMemory:
    """The host ledger of one rank: DeepSpeed's buffers (offload plans), the offloaded activations (pinned
    blocks, as the caller counted them), a paged optimizer's spill (pageable), the load and the process."""
    pinned: dict[str, int] = {}
    pageable: dict[str, int] = {}
    out = list(notes)
    if plan.offload == "fsdp_cpu":
        for b in fsdp_offload_buffers(model, plan):
            target = pinned if b.pinned else pageable
            target[b.category] = target.get(b.category, 0) + b.nbytes
        out.append("FSDP CPU offload: parameter and gradient shards pinned (CPUOffloadPolicy pin_memory), optimizer "
                   "states pageable")
    elif plan.offload != "none":
        pinned, pageable, more = deepspeed_host(model, plan)
        out += more
    if activations_pinned:
        pinned["activations"] = pinned.get("activations", 0) + int(activations_pinned)
        out.append("offloaded activations: pinned, one power-of-two block per saved tensor (torch "
                   "CachingHostAllocator)")
    if spill_bytes:
        pageable["optimizer_states"] = pageable.get("optimizer_states", 0) + int(spill_bytes)
        out.append("paged optimizer: its spill is CUDA managed memory the driver evicted to the host (pageable)")
    load, what = load_host_bytes(model, plan)
    return HostMemory(pinned=pinned, pageable=pageable, load_bytes=load, load_what=what,
                      baseline_bytes=process_baseline_bytes(), notes=tuple(out))


__all__ = ["whole_model_load", "DEEPSPEED_PIN_MEMORY", "HostBuffer", "deepspeed_buffers", "OFFLOAD_MIN_BYTES",
           "fsdp_host_load", "fsdp_offload_buffers", "fsdp_stored_tensors",
           "SHARDED", "ZERO3_PERSISTENCE", "ZERO3_SUB_GROUP", "deepspeed_host",
           "host_memory", "load_host_bytes", "param_tensors", "pinned_block_bytes", "pinned_bytes_of",
           "process_baseline_bytes", "trainable_tensors"]
