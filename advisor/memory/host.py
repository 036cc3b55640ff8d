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
- **Loading**: the exported train.py loads a 4/8-bit model with a ``device_map`` (one tensor staged on the host
  at a time: transformers core_model_loading.py:1461-1466 ``_materialize_copy``, loaded synchronously when
  quantizing on the fly, :1862-1871), and any other model onto the CPU whole before the Trainer moves it to the
  GPU (no ``device_map``: every parameter materialized on the host). The safetensors file itself is mapped
  (page cache, which the kernel reclaims) and is not counted.
- **The process**: Python and the training libraries (advisor/data/host_memory.yaml ``process_baseline``).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Iterable

from advisor.core.catalog import ModelSpec
from advisor.core.plan import DTYPE_BYTES, Plan, lora_target_modules
from advisor.memory.ledger import HostMemory

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
    """Elements of every parameter tensor of the model: numel -> how many (linears, biases, norms, embedding,
    an untied output head, the final norm)."""
    arch = model.arch or {}
    c: Counter = Counter()
    L = model.num_layers
    for i, o in model.linear_shapes().values():
        c[i * o] += L
    for n in model.layer_bias_params().values():
        c[n] += L
    c[model.hidden_size] += L * arch.get("norms_per_layer", 2) + 1  # layer norms and the final norm
    if arch.get("qk_norm"):
        c[model.head_dim] += 2 * L
    c[model.embedding_params] += 1
    if model.lm_head_params:
        c[model.lm_head_params] += 1
    return c


def trainable_tensors(model: ModelSpec, plan: Plan) -> Counter:
    """Elements of every trainable tensor: LoRA's A (r x in) and B (out x r) per targeted module and layer (and
    DoRA's magnitude vector), or every parameter for a full fine-tune."""
    if not plan.peft:
        return param_tensors(model)
    shapes = model.linear_shapes()
    c: Counter = Counter()
    for m in lora_target_modules(plan, list(shapes)):
        i, o = shapes[m]
        c[plan.lora_r * i] += model.num_layers
        c[plan.lora_r * o] += model.num_layers
        if plan.dora:
            c[o] += model.num_layers
    return c


def _sixteen_bit(plan: Plan) -> int:
    """Bytes of DeepSpeed's low-precision copy: bf16 or fp16 when the exported config enables either, else fp32
    (advisor/configs/_deepspeed.py sets ``bf16.enabled`` / ``fp16.enabled`` from the plan's precision)."""
    return 2 if plan.precision in ("bf16", "fp16", "mixed_bf16", "mixed_fp16") else 4


# ----------------------------------------------------------------------------- DeepSpeed ZeRO-Offload

def deepspeed_host(model: ModelSpec, plan: Plan, pin_optimizer: bool = DEEPSPEED_PIN_MEMORY,
                   pin_param: bool = DEEPSPEED_PIN_MEMORY) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """(pinned, pageable, notes) of DeepSpeed ZeRO-Offload on one rank, buffer by buffer as DeepSpeed 0.19
    allocates them. The HF Trainer hands DeepSpeed one parameter group (transformers integrations/deepspeed.py:669,
    ``DummyOptim``), so each flat partition is one tensor: one pinned block."""
    tensors = trainable_tensors(model, plan)
    n = sum(k * v for k, v in tensors.items())
    largest = max(tensors) if tensors else 0
    p16 = _sixteen_bit(plan)
    pinned: dict[str, int] = {}
    pageable: dict[str, int] = {}

    def put(kind_pinned: bool, category: str, nbytes: int, blocks: int | None = None) -> None:
        target = pinned if kind_pinned else pageable
        target[category] = target.get(category, 0) + int(blocks if kind_pinned and blocks is not None
                                                          else (pinned_block_bytes(nbytes) if kind_pinned else nbytes))

    # DeepSpeedCPUAdam: fp32 exp_avg and exp_avg_sq, zeros_like on the CPU: pageable (ops/adam/cpu_adam.py:161-164)
    put(False, "optimizer_states", 8 * n)
    if plan.offload == "zero2_cpu":
        # stage_1_and_2.py:560-565 the fp32 master partition, pinned by offload_optimizer.pin_memory
        put(pin_optimizer, "master_weights", 4 * n)
        # :566-575 a 16-bit buffer of the partition, to copy the updated weights back to the GPU
        put(pin_optimizer, "weights", p16 * n)
        # :936-941 the fp32 gradient partition; :656-658 a staging buffer of the largest parameter (16-bit)
        put(pin_optimizer, "gradients", 4 * n)
        put(pin_optimizer, "gradients", p16 * largest)
        if plan.grad_accum > 1:
            # :1822-1825, :2166 with accumulation, one 16-bit buffer per parameter, each pinned on its own
            blocks = pinned_bytes_of(Counter({p16 * k: v for k, v in tensors.items()}))
            put(pin_optimizer, "gradients", p16 * n, blocks)
        notes = ["ZeRO-2 offload (DeepSpeed stage_1_and_2.py): fp32 master, 16-bit copy and fp32 gradients "
                 f"{'pinned' if pin_optimizer else 'pageable'}, CPU Adam moments pageable"]
        return pinned, pageable, notes
    # ZeRO-3: every parameter over the persistence threshold partitioned to the host, each pinned on its own by
    # offload_param.pin_memory (partition_parameters.py:1836-1843); the trainable ones are then copied into one
    # flat pinned buffer (stage3.py:906, pinned whatever the setting) and their first blocks stay in torch's host
    # cache (freed blocks are kept for reuse)
    offloaded = Counter({k: v for k, v in param_tensors(model).items() if k > ZERO3_PERSISTENCE})
    p_w = DTYPE_BYTES[plan.param_dtype]
    if pin_param:
        put(True, "weights", 0, pinned_bytes_of(Counter({p_w * k: v for k, v in offloaded.items()})))
    else:
        put(False, "weights", p_w * sum(k * v for k, v in offloaded.items()))
    put(True, "weights", p16 * n)
    # stage3.py:1158-1160 the fp32 partition, a clone of a CPU tensor: pageable
    put(False, "master_weights", 4 * n)
    # stage3.py:790-795 the flat gradient buffer in the accumulation dtype (the model's: engine.py:1806), and
    # :1338-1342 an fp32 gradient buffer per sub-group, both pinned by offload_optimizer.pin_memory
    put(pin_optimizer, "gradients", p16 * n)
    groups = Counter({ZERO3_SUB_GROUP: n // ZERO3_SUB_GROUP})
    if n % ZERO3_SUB_GROUP:
        groups[n % ZERO3_SUB_GROUP] += 1
    put(pin_optimizer, "gradients", 4 * n, pinned_bytes_of(Counter({4 * k: v for k, v in groups.items()})))
    notes = ["ZeRO-3 offload (DeepSpeed stage3.py, partition_parameters.py): 16-bit parameters and gradient "
             "buffers pinned, fp32 partition and CPU Adam moments pageable"]
    return pinned, pageable, notes


# ----------------------------------------------------------------------------- loading

def load_host_bytes(model: ModelSpec, plan: Plan) -> tuple[int, str]:
    """(host bytes, what) of loading the model as the exported train.py does (see the module docstring)."""
    p = DTYPE_BYTES[plan.param_dtype]
    largest = max(param_tensors(model)) * p
    if plan.offload == "zero3_cpu":
        # zero.Init partitions each parameter as it is made; loading gathers one module at a time
        # (transformers integrations/deepspeed.py _load_state_dict_into_zero3_model)
        return int(largest), "one tensor staged at a time (zero.Init)"
    if plan.quantized and plan.offload == "none":
        return int(largest), "one tensor staged at a time (device_map, quantized as it loads)"
    return int(model.params_total * p), "the whole model on the CPU before the Trainer moves it to the GPU"


# ----------------------------------------------------------------------------- the ledger

def host_memory(model: ModelSpec, plan: Plan, *, activations_pinned: int = 0,
                spill_bytes: int = 0, notes: Iterable[str] = ()) -> HostMemory:
    """The host ledger of one rank: DeepSpeed's buffers (offload plans), the offloaded activations (pinned
    blocks, as the caller counted them), a paged optimizer's spill (pageable), the load and the process."""
    pinned: dict[str, int] = {}
    pageable: dict[str, int] = {}
    out = list(notes)
    if plan.offload != "none":
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


__all__ = ["DEEPSPEED_PIN_MEMORY", "OFFLOAD_MIN_BYTES", "SHARDED", "ZERO3_PERSISTENCE", "ZERO3_SUB_GROUP", "deepspeed_host",
           "host_memory", "load_host_bytes", "param_tensors", "pinned_block_bytes", "pinned_bytes_of",
           "process_baseline_bytes", "trainable_tensors"]
