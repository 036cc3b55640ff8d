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
from advisor.memory.training import NF4_BLOCK

DYNAMIC_MAP_ENTRIES = 256  # bitsandbytes' dynamic quantization map (functional.create_dynamic_map: 256 codes)
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
                packed, qs = F.quantize_4bit(linear.weight.data, blocksize=NF4_BLOCK,
                                             compress_statistics=double_quant, quant_type=quant_type,
                                             quant_storage=torch.uint8)
            weight = torch.nn.Parameter(packed, requires_grad=False)
            weight.quant_state, weight.blocksize, weight.bnb_quantized = qs, NF4_BLOCK, True
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
    F.name2qmap["dynamic"] = torch.zeros(DYNAMIC_MAP_ENTRIES, dtype=torch.float32, device=weight.device)
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
    """Qualified names of the linears bitsandbytes quantizes when transformers loads ``model`` with a
    BitsAndBytesConfig: every module that is exactly ``nn.Linear`` and not in ``get_keys_to_not_convert`` (the
    output embedding, tied weights; transformers/integrations/bitsandbytes.py ``replace_with_bnb_linear``). Stacked
    experts and routers are not ``nn.Linear``: they stay in the compute dtype, as bitsandbytes leaves them
    (reports/moe_findings.md section 2)."""
    from advisor.core.architecture import bnb_linear_names

    return bnb_linear_names(model)


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
            new.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, blocksize=NF4_BLOCK,
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


# --------------------------------------------------------------------------- optimizers without a GPU compiler


def eager_torchao_step(opt) -> None:
    """Run torchao's ``single_param_adam`` eagerly: ``_AdamBase.step`` compiles it with ``torch.compile(...,
    fullgraph=True)``, which refuses to trace under a ``TorchDispatchMode`` (the tracker, fake tensors) and
    needs a compiler on the CPU. The same Python function runs instead, op by op (torchao/optim/adam.py),
    as one kernel would: its fp32 intermediates are not counted (Inductor fuses the dequantize, the Adam
    update and the blockwise requantize of one parameter into kernels that write the states and the
    parameter in place). The states it keeps are the library's own tensors; only the step's transient is
    this stand-in's, and it is unverified on a GPU."""
    import types

    import torch
    import torchao.optim.adam as ao_adam

    if getattr(ao_adam, "_advisor_eager", False):
        return

    class _Torch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    proxy = _Torch("torch")
    proxy.compile = lambda fn=None, **_: _as_one_kernel(fn)
    ao_adam.torch = proxy  # only torchao.optim.adam sees the eager compile
    ao_adam._advisor_eager = True


def _as_one_kernel(fn):
    """``fn`` with the live-bytes tracker paused: a compiled kernel allocates no intermediates."""
    import functools

    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    @functools.wraps(fn)
    def run(*args, **kwargs):
        modes = [m for m in _get_current_dispatch_mode_stack() if hasattr(m, "paused")]
        for m in modes:
            m.paused += 1
        try:
            return fn(*args, **kwargs)
        finally:
            for m in modes:
                m.paused -= 1

    return run


def no_cuda_synchronize(opt) -> None:
    """GaLore's 8-bit AdamW calls ``torch.cuda.synchronize()`` around its update
    (galore_torch/adamw8bit.py); without CUDA there is nothing to wait for."""
    import types

    import torch
    import galore_torch.adamw8bit as g8

    if getattr(g8, "_advisor_nosync", False):
        return

    class _Torch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    proxy = _Torch("torch")
    proxy.cuda = types.SimpleNamespace(synchronize=lambda *a, **k: None, is_available=lambda: False)
    g8.torch = proxy
    g8._advisor_nosync = True


@contextlib.contextmanager
def cuda_is_the_cpu():
    """``Tensor.cuda()`` returns the tensor itself while building an optimizer that hard-codes it (AdaLomo's
    factored states), on a machine without CUDA: the sizes are the same wherever the tensor lives."""
    import torch

    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def fake_update_norm() -> None:
    """galore-torch's 8-bit AdamW passes its arguments to bitsandbytes' Optimizer2State by position, so
    ``block_wise=True`` lands on ``max_unorm`` (bitsandbytes 0.4x+ signature): every 32-bit update then
    computes ``torch.norm(p.data.float())`` and passes it as a float, which a fake tensor cannot be. Under
    fake tensors, compute the same norm (its fp32 copy is the memory) and pass the op a placeholder float."""
    import bitsandbytes.functional as F
    import torch

    if getattr(F, "_advisor_fake_norm", False):
        return
    original = F.optimizer_update_32bit

    def update(optimizer_name, g, p, state1, beta1, eps, step, lr, state2=None, beta2=0.0, beta3=0.0, alpha=0.0,
               weight_decay=0.0, gnorm_scale=1.0, unorm_vec=None, max_unorm=0.0, skip_zeros=False):
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(p, FakeTensor) and max_unorm > 0.0:
            torch.norm(p.data.float())
            return torch.ops.bitsandbytes.optimizer_update_32bit(
                optimizer_name, g, p, state1, state2, unorm_vec, float(max_unorm), 1.0, beta1, beta2, beta3, alpha,
                eps, weight_decay, step, lr, gnorm_scale, skip_zeros)
        return original(optimizer_name, g, p, state1, beta1, eps, step, lr, state2, beta2, beta3, alpha,
                        weight_decay, gnorm_scale, unorm_vec, max_unorm, skip_zeros)

    F.optimizer_update_32bit = update
    F._advisor_fake_norm = True
