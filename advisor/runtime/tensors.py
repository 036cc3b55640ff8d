"""Small tensor helpers shared by the step builder and the simulation's stand-ins (torch is
imported inside each function, so importing this module costs nothing)."""

from __future__ import annotations

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
IGNORE_INDEX = -100
"""Label positions the loss skips: transformers' ForCausalLMLoss ``ignore_index`` (loss_utils.py), liger's too."""


def torch_dtype(name: str):
    """The torch dtype of a Plan dtype name (bf16, fp16, fp32)."""
    import torch

    return getattr(torch, TORCH_DTYPES[name])


def is_fake(t) -> bool:
    """Whether ``t`` is a FakeTensor (the simulation) rather than a real tensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
