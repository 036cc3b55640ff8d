"""Quantized base layers: real bitsandbytes layers, or stand-ins that work on fake tensors.

bitsandbytes' ``Params4bit`` / ``Int8Params`` cannot wrap a ``FakeTensor``. The stand-ins are
subclasses of ``bnb.nn.Linear4bit`` / ``bnb.nn.Linear8bitLt`` (so peft injects its bitsandbytes
LoRA layers into them, with their defensive ``result.clone()``) whose weight is a plain
``nn.Parameter`` holding what ``Params4bit`` holds: the packed weight quantized by the same
``bitsandbytes.functional.quantize_4bit`` (absmax, double-quantization constants, codes). The
forward pass is bitsandbytes' own ``Linear4bit.forward`` -> ``matmul_4bit`` -> ``MatMul4Bit``,
so the same tensors are saved for backward. 8-bit: ``int8_vectorwise_quant`` gives CB / SCB as
``Int8Params`` does, and the forward runs ``MatMul8bitLt`` (what CUDA runs) or bitsandbytes'
device dispatch (``MatMul8bitFp`` on the CPU) when the target is the CPU.
"""

from __future__ import annotations

import contextlib

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan

BLOCKSIZE_4BIT = 64       # BitsAndBytesConfig / Params4bit default blocksize
INT8_THRESHOLD = 6.0      # BitsAndBytesConfig.llm_int8_threshold default


def _classes():
    import bitsandbytes as bnb
    import torch
    from bitsandbytes.autograd._functions import MatMul8bitLt

    class StandinLinear4bit(bnb.nn.Linear4bit):
        """``bnb.nn.Linear4bit`` whose weight is a plain Parameter (fake-tensor friendly)."""

        def __init__(self, linear, quant_type: str, double_quant: bool, compute_dtype):
            import bitsandbytes.functional as F

            torch.nn.Module.__init__(self)
            self.in_features, self.out_features = linear.in_features, linear.out_features
            with _dynamic_map_for(linear.weight):
                packed, qs = F.quantize_4bit(linear.weight.data, blocksize=BLOCKSIZE_4BIT,
                                             compress_statistics=double_quant, quant_type=quant_type,
                                             quant_storage=torch.uint8)
            weight = torch.nn.Parameter(packed, requires_grad=False)
            weight.quant_state, weight.blocksize, weight.bnb_quantized = qs, BLOCKSIZE_4BIT, True
            weight.compress_statistics, weight.quant_type, weight.quant_storage = double_quant, quant_type, torch.uint8
            self.weight = weight
            self.bias = linear.bias
            if self.bias is not None:
                self.bias.requires_grad_(False)
            self.compute_dtype = compute_dtype
            self.compute_type_is_set = True
            self.quant_state = qs
            self.quant_storage = torch.uint8
            self.support_avx512bf16_for_cpu = False

    class StandinLinear8bitLt(bnb.nn.Linear8bitLt):
        """``bnb.nn.Linear8bitLt`` (has_fp16_weights=False) whose weight is a plain int8 Parameter."""

        def __init__(self, linear, threshold: float, cuda_path: bool):
            import bitsandbytes.functional as F

            torch.nn.Module.__init__(self)
            self.in_features, self.out_features = linear.in_features, linear.out_features
            CB, SCB, _ = F.int8_vectorwise_quant(linear.weight.data.contiguous().to(torch.float16))
            self.weight = torch.nn.Parameter(CB, requires_grad=False)
            self.weight.CB, self.weight.SCB, self.weight.has_fp16_weights = None, None, False
            self.bias = linear.bias
            if self.bias is not None:
                self.bias.requires_grad_(False)
            self.state = bnb.MatmulLtState()
            self.state.threshold = threshold
            self.state.has_fp16_weights = False
            self.state.use_pool = threshold > 0.0
            self.state.CB, self.state.SCB = self.weight.data, SCB
            self.index = None
            self.cuda_path = cuda_path

        def forward(self, x):
            # bitsandbytes Linear8bitLt.forward, with the CUDA autograd function chosen explicitly
            self.state.is_training = self.training
            if self.bias is not None and self.bias.dtype != x.dtype:
                self.bias.data = self.bias.data.to(x.dtype)
            if self.cuda_path:
                return MatMul8bitLt.apply(x, self.weight, None, self.bias, self.state)
            return bnb.matmul(x, self.weight, bias=self.bias, state=self.state)

    return StandinLinear4bit, StandinLinear8bitLt


@contextlib.contextmanager
def _dynamic_map_for(weight):
    """Double quantization builds bitsandbytes' dynamic 8-bit map with ``.tolist()`` (data-dependent
    under fake tensors); hand it a map made in the weight's own mode (values matter only for real
    tensors, where the real map is used)."""
    import bitsandbytes.functional as F
    import torch

    from advisor.runtime.tensors import is_fake

    if not is_fake(weight):
        yield
        return
    saved = F.name2qmap.get("dynamic")
    F.name2qmap["dynamic"] = torch.zeros(256, dtype=torch.float32, device=weight.device)
    try:
        yield
    finally:
        if saved is None:
            F.name2qmap.pop("dynamic", None)
        else:
            F.name2qmap["dynamic"] = saved


@contextlib.contextmanager
def fake_dynamic_map():
    """bitsandbytes builds its dynamic 8-bit maps with ``.tolist()``, which fake tensors cannot do;
    while building under fake tensors, make them as zeros of the same size (values are never read)."""
    import bitsandbytes.functional as F
    import torch

    original = F.create_dynamic_map

    def sized(signed=True, max_exponent_bits=7, total_bits=8):
        return torch.zeros(2**total_bits, dtype=torch.float32)

    F.create_dynamic_map = sized
    try:
        yield
    finally:
        F.create_dynamic_map = original


def quantized_linear_names(model, spec: ModelSpec) -> list[str]:
    """Qualified names of the decoder-layer linears bitsandbytes quantizes (lm_head is kept, as
    transformers' get_keys_to_not_convert does)."""
    import torch

    wanted = set(spec.linear_shapes())
    return [n for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in wanted and ".layers." in f".{n}"]


def quantize_model(model, spec: ModelSpec, plan: Plan, *, device: str, impl: str, target_device: str) -> None:
    """Replace the decoder-layer linears of ``model`` with 4-bit / 8-bit layers, in place."""
    import bitsandbytes as bnb
    import torch

    from advisor.runtime.tensors import is_fake, torch_dtype

    Standin4, Standin8 = _classes()
    if plan.quantization == "int8":
        import logging

        # MatMul8bitLt warns on every call that bf16 inputs are cast to fp16 (the cast is counted, the line is noise)
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    compute = torch_dtype(plan.compute_dtype)
    fake = is_fake(next(iter(model.parameters())))
    for name in quantized_linear_names(model, spec):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        lin = getattr(parent, child)
        if plan.four_bit and impl == "standin":
            new = Standin4(lin, plan.quantization, plan.double_quant, compute)
        elif plan.four_bit:
            new = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None, compute_dtype=compute,
                                    compress_statistics=plan.double_quant, quant_type=plan.quantization,
                                    quant_storage=torch.uint8, device="meta")
            new.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, blocksize=BLOCKSIZE_4BIT,
                                           compress_statistics=plan.double_quant, quant_type=plan.quantization,
                                           quant_storage=torch.uint8, module=new)._quantize(torch.device(device))
            new.bias = _frozen(lin.bias)
        elif impl == "standin":
            # outlier columns are data-dependent: under fake tensors no outlier decomposition (threshold 0)
            new = Standin8(lin, 0.0 if fake else INT8_THRESHOLD, cuda_path=target_device.startswith("cuda"))
        else:
            new = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      has_fp16_weights=False, threshold=INT8_THRESHOLD, device="meta")
            new.weight = bnb.nn.Int8Params(lin.weight.data, requires_grad=False,
                                           has_fp16_weights=False)._quantize(torch.device(device))
            new.bias = _frozen(lin.bias)
        setattr(parent, child, new)
        del lin
    # what transformers sets on a model loaded with a BitsAndBytesConfig; peft dispatches on it
    model.is_loaded_in_4bit = plan.four_bit
    model.is_loaded_in_8bit = plan.quantization == "int8"
    model.is_quantized = True
    for p in model.parameters():
        p.requires_grad_(False)


def _frozen(bias):
    if bias is not None:
        bias.requires_grad_(False)
    return bias


def quant_constant_tensors(model) -> list:
    """The quantization constants of every 4-bit / 8-bit layer (absmax, codes, offsets, SCB)."""
    import bitsandbytes as bnb

    out = []
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            qs = getattr(m.weight, "quant_state", None)
            if qs is not None:
                out += [qs.absmax, qs.code]
                if qs.nested:
                    out += [qs.offset, qs.state2.absmax, qs.state2.code]
        elif isinstance(m, bnb.nn.Linear8bitLt):
            out += [t for t in (m.state.SCB, getattr(m.weight, "SCB", None)) if t is not None]
    return [t for t in out if t is not None and hasattr(t, "untyped_storage")]


def unpage_optimizer(opt) -> None:
    """Paged bitsandbytes optimizers allocate state with cudaMallocManaged; without CUDA (or under fake
    tensors) allocate it as ordinary tensors of the same size (bnb Optimizer8bit.get_state_buffer)."""
    opt.is_paged = False
