"""Simulate ``from_pretrained`` the way transformers 5 and bitsandbytes load a model onto the GPU.

transformers 5 (``core_model_loading.convert_and_load_state_dict_in_model``) walks the checkpoint's
tensors sorted by ``dot_natural_key`` (``lm_head`` before ``model.embed_tokens`` before
``model.layers.0`` ... ``model.norm``). With on-the-fly bitsandbytes quantization it loads
synchronously ("to avoid worker threads loading full-precision tensors to GPU faster than the main
thread can quantize them"), one tensor at a time:

- the tensor is materialized on the GPU in the load dtype (``_materialize_copy``: ``tensor.to(device,
  dtype)``; a CPU->GPU copy that changes dtype converts on the CPU, aten/src/ATen/native/cuda/Copy.cu
  "Type conversions are performed on the CPU for CPU-GPU copies");
- 4-bit: ``Bnb4bitQuantize`` wraps it in ``Params4bit`` and ``Params4bit._quantize`` calls
  ``bitsandbytes.functional.quantize_4bit`` on it (packed codes, absmax, and with double quantization
  the absmax quantized again); the 16-bit tensor is freed when the next tensor is loaded;
- 8-bit: ``Bnb8bitQuantize`` copies it to the CPU and ``Int8Params._quantize`` moves it back as fp16
  (``.to(device, dtype=float16)``) for ``int8_vectorwise_quant``; the 16-bit value is still held;
- unquantized tensors are kept as they are.

Here the same walk runs on fake tensors under the live-bytes tracker, with the real
``bitsandbytes.functional`` quantization ops, over the names and shapes of the real transformers
model built on the meta device. peft's ``get_peft_model`` then adds the fp32 adapters. The tracker's
records are the allocation sequence of the load, for the allocator model.

Without a quantization config the exported script loads on the CPU and ``Trainer`` moves the model
to the GPU parameter by parameter (``Module.to``): the GPU holds the weights and nothing more, which
the same walk reproduces (every tensor is kept as loaded).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan


@dataclass(frozen=True)
class LoadTrace:
    """The simulated load of one model under one plan."""

    live_peak_bytes: int
    """Highest live bytes during the load (allocated)."""
    final_bytes: int
    """Live bytes when loading (and adapter injection) is done."""
    peak_tensor: str
    """The checkpoint tensor being loaded at the peak."""
    events: tuple[tuple[int, int], ...] = field(repr=False, default=())
    """The allocation sequence: (uid, +bytes) for an allocation, (uid, -bytes) for a free, in order."""
    seconds: float = 0.0


def _key(spec: ModelSpec, plan: Plan) -> tuple:
    from advisor.runtime.build import lora_targets

    targets = tuple(lora_targets(spec, plan)[0]) if plan.peft else ()
    return (spec, plan.quantization, plan.double_quant, plan.compute_dtype if plan.quantized else plan.param_dtype,
            targets, plan.lora_r if plan.peft else 0)


def simulate_load(spec: ModelSpec, plan: Plan, *, fake: bool = True) -> LoadTrace:
    """The load of ``spec`` as ``plan`` loads it (cached per model, quantization, dtype and adapters).
    ``fake=False`` runs the same walk on real CPU tensors (the proof that the fake walk allocates as
    execution does; tiny models only)."""
    return _simulate(*_key(spec, plan), fake)


@lru_cache(maxsize=32)
def _simulate(spec: ModelSpec, quantization: str, double_quant: bool, dtype_name: str, targets: tuple,
              lora_r: int, fake: bool = True) -> LoadTrace:
    import contextlib

    import bitsandbytes.functional as F
    import torch
    from torch._subclasses import FakeTensorMode
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import dot_natural_key

    from advisor.runtime.build import hf_config
    from advisor.runtime.tensors import torch_dtype
    from advisor.memory.training import NF4_BLOCK
    from advisor.runtime.simulate.standins import DYNAMIC_MAP_ENTRIES, quantized_linear_names
    from advisor.runtime.simulate.tracker import LiveBytes

    start = time.perf_counter()
    plan = Plan(quantization=quantization, double_quant=double_quant,
                method="qlora" if quantization in ("nf4", "fp4") else "lora")
    dtype = torch_dtype(dtype_name)
    if spec.is_vision_language:  # the whole checkpoint: tower, projector and language model
        from advisor.runtime.simulate.vision import build_vl_model

        model = build_vl_model(spec, plan, "meta", None, "eager", dtype)
    else:
        cfg = hf_config(spec, plan, None, "eager")  # the attention kernel holds no weights
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    quantized = {n + ".weight" for n in quantized_linear_names(model, spec)} if quantization != "none" else set()
    # the checkpoint's tensors: parameters once (tied weights are one tensor) and persistent buffers
    tensors = dict(model.named_parameters())
    non_persistent = {f"{m}.{b}".lstrip(".") for m, mod in model.named_modules()
                      for b in mod._non_persistent_buffers_set}
    tensors.update({n: b for n, b in model.named_buffers() if n not in non_persistent})
    order = sorted(tensors, key=dot_natural_key)
    shapes = {n: (tuple(tensors[n].shape), tensors[n].dtype) for n in order}
    buffers = [tuple(b.shape) + (b.dtype,) for n, b in model.named_buffers() if n in non_persistent]
    del model, tensors

    tracker = LiveBytes()
    kept: list = []
    at_peak, peak = "", 0
    saved_map = F.name2qmap.pop("dynamic", None)
    with FakeTensorMode() if fake else contextlib.nullcontext(), tracker:
        if fake and double_quant:
            # bitsandbytes builds its 256-entry dynamic map once per process on first use (functional.py
            # quantize_blockwise: name2qmap["dynamic"] = create_dynamic_map().to(A.device)); its .tolist() is
            # data-dependent under fake tensors, so make the same-sized map here, once
            F.name2qmap["dynamic"] = torch.zeros(DYNAMIC_MAP_ENTRIES, dtype=torch.float32)
        for *shape, bdtype in buffers:  # non-persistent buffers (rotary inv_freq) are made on the device at init
            kept.append(torch.empty(shape, dtype=bdtype))
        for name in order:
            shape, pdtype = shapes[name]
            value = torch.zeros(shape, dtype=dtype if pdtype.is_floating_point else pdtype)
            if name in quantized and quantization in ("nf4", "fp4"):
                packed, state = F.quantize_4bit(value, blocksize=NF4_BLOCK, compress_statistics=double_quant,
                                                quant_type=quantization, quant_storage=torch.uint8)
                kept.append((packed, state))
            elif name in quantized:
                fp16 = torch.zeros(shape, dtype=torch.float16)  # Int8Params._quantize: back from the CPU as fp16
                cb, scb, _ = F.int8_vectorwise_quant(fp16)
                kept.append((cb, scb))
                del fp16
            else:
                kept.append(value)
            if tracker.peak.bytes > peak:
                peak, at_peak = tracker.peak.bytes, name
            del value
        # peft get_peft_model: fp32 LoRA A (r x in) and B (out x r) on each targeted linear's device
        # (peft/tuners/lora/layer.py update_layer, autocast_adapter_dtype upcasts 16-bit adapters to fp32)
        for layer in spec.description.layers if targets else ():
            for m in layer.linears:
                if m.short in targets:
                    kept.append(torch.empty(lora_r, m.in_features, dtype=torch.float32))
                    kept.append(torch.empty(m.out_features, lora_r, dtype=torch.float32))
        if tracker.peak.bytes > peak:
            peak, at_peak = tracker.peak.bytes, "LoRA adapters (get_peft_model)"
        final = tracker.live_bytes
        events = _events(tracker.records)
    F.name2qmap.pop("dynamic", None)
    if saved_map is not None:
        F.name2qmap["dynamic"] = saved_map
    return LoadTrace(int(peak), int(final), at_peak, events, time.perf_counter() - start)


def _events(records) -> tuple[tuple[int, int], ...]:
    """Alloc/free events of the tracker's records, in the order they happened."""
    ev = [(r.born, r.uid, r.nbytes) for r in records]
    ev += [(r.died, r.uid, -r.nbytes) for r in records if r.died is not None]
    ev.sort()
    return tuple((uid, n) for _, uid, n in ev)
