"""The floating-point dtypes of a plan, declared once: the Plan's name, torch's name and bytes per value.

A plan names a dtype the short way (``bf16``, advisor.core.plan ``DTYPES``); a model description and torch the
long way (``bfloat16``, ``torch.bfloat16``). Both read their sizes from this one table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dtype:
    name: str
    """The Plan's name (precision, compute_dtype)."""
    torch_name: str
    """``torch.<name>`` without the prefix, as ``str(tensor.dtype)`` and ``from_pretrained(dtype=...)`` write it."""
    bytes: int
    """Bytes per value (IEEE 754 binary32 / binary16; bfloat16 is binary32's top half)."""


TABLE = (Dtype("bf16", "bfloat16", 2), Dtype("fp16", "float16", 2), Dtype("fp32", "float32", 4))
DTYPES = tuple(d.name for d in TABLE)
"""The dtypes a plan may name, in its order."""
DTYPE_BYTES = {d.name: d.bytes for d in TABLE}
"""The Plan's dtype name → bytes per value."""
TORCH_NAMES = {d.name: d.torch_name for d in TABLE}
"""The Plan's dtype name → torch's."""
_BY_ANY_NAME = {**{d.name: d for d in TABLE}, **{d.torch_name: d for d in TABLE},
                **{f"torch.{d.torch_name}": d for d in TABLE}}


def dtype_bytes(name: str) -> int:
    """Bytes per value of a dtype named either way (``bf16``, ``bfloat16`` or ``torch.bfloat16``); a dtype this
    table does not hold is an error, never a guess."""
    try:
        return _BY_ANY_NAME[name].bytes
    except KeyError:
        raise KeyError(f"dtype {name!r} is not in advisor.core.dtypes.TABLE (known: "
                       f"{', '.join(_BY_ANY_NAME)})") from None


__all__ = ["DTYPES", "DTYPE_BYTES", "Dtype", "TABLE", "TORCH_NAMES", "dtype_bytes"]
