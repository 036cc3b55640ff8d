"""Pre-quantized checkpoints a serving plan loads (advisor/data/serving_checkpoints.yaml): vLLM serves AWQ, GPTQ
and W8A16 weights only from a checkpoint already in that format, whose config.json fixes the group size."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from advisor.core.data_files import load_data_file

FORMAT_KEY = {"awq": "awq", "gptq": "gptq", "int8": "w8a16"}
"""The data file's key for an int4 plan's quant_method, or for the int8 (W8A16) format."""
CHECKPOINT_FORMATS = ("int4", "int8")
"""Weight formats vLLM loads only from a pre-quantized checkpoint (fp8 quantizes a 16-bit checkpoint at load)."""
MADE_GROUP_SIZE = 128
"""Group size of a checkpoint made with llm-compressor's W4A16 preset (compressed_tensors QuantizationScheme
preset W4A16: group strategy, group_size 128), the command the export prints when none is published."""


@dataclass(frozen=True)
class Checkpoint:
    hf_id: str
    group_size: int


@lru_cache(maxsize=1)
def _table() -> dict:
    return load_data_file("serving_checkpoints.yaml") or {}


def checkpoint_key(weight_format: str, quant_method: str) -> str | None:
    if weight_format == "int4":
        return FORMAT_KEY[quant_method]
    return FORMAT_KEY.get(weight_format)


def published_checkpoint(hf_id: str, weight_format: str, quant_method: str = "awq") -> Checkpoint | None:
    """The published checkpoint of ``hf_id`` in that format, or None (none listed: the user makes one)."""
    key = checkpoint_key(weight_format, quant_method)
    entry = (_table().get(hf_id) or {}).get(key) if key else None
    return Checkpoint(entry["hf_id"], int(entry["group_size"])) if entry else None


def checkpoint_group_size(hf_id: str, quant_method: str) -> int:
    """The int4 group size a served checkpoint of ``hf_id`` has: the published one's, else the W4A16 preset's."""
    found = published_checkpoint(hf_id, "int4", quant_method)
    return found.group_size if found else MADE_GROUP_SIZE
