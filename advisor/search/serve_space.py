"""The serving search space (advisor/data/spaces/inference.yaml): fixed job values and the searched choices."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.memory.inference import KV_DTYPES, QUANT_METHODS, WEIGHT_FORMATS
from advisor.search.space import SPACES_DIR, parsed_overrides, read_space_file

__all__ = ["SPACES_DIR", "ServeSpace", "load_serve_space"]


# key -> allowed values (None: positive whole numbers)
SEARCH_KEYS: dict[str, tuple | None] = {
    "weight_format": WEIGHT_FORMATS, "quant_method": QUANT_METHODS, "kv_dtype": KV_DTYPES,
    "block_size": None, "context_len": None,
}
NOT_SEARCHED = {"group_size": "not searched: an int4 plan takes the group size of the checkpoint it serves "
                             "(advisor/data/serving_checkpoints.yaml; 128 for one made with llm-compressor's W4A16)"}
FIXED_KEYS = {"quality_floor": "fraction", "max_num_batched_tokens": "int", "max_concurrency": "int",
              "tie_tolerance": "fraction"}


@dataclass(frozen=True)
class ServeSpace:
    """A validated serving space."""

    name: str
    fixed: dict[str, Any]
    """quality_floor, max_num_batched_tokens, max_concurrency, tie_tolerance."""
    search: dict[str, list]
    """Choices of each searched knob."""
    source: str = ""
    """The file it was read from."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "fixed": self.fixed, "search": self.search, "source": self.source}


def load_serve_space(ref: str = "inference", overrides: list[str] | tuple[str, ...] = ()) -> ServeSpace:
    """Load a space by name (advisor/data/spaces/<name>.yaml) or path; ``key=value`` overrides; all errors at once.

    The file is read, and overrides parsed, by the training loader's functions (advisor.search.space)."""
    data, source = read_space_file(ref, "inference")
    path = Path(source)
    fixed = dict(data.get("fixed") or {})
    search = {k: list(v) if isinstance(v, list) else [v] for k, v in (data.get("search") or {}).items()}
    errors: list[AdvisorInputError] = []
    for text, key, value in parsed_overrides(overrides, errors):
        if key in FIXED_KEYS:
            fixed[key] = value
        elif key in SEARCH_KEYS:
            search[key] = list(value) if isinstance(value, list) else [value]
        elif key in NOT_SEARCHED:
            errors.append(AdvisorInputError(key, NOT_SEARCHED[key], text))
        else:
            errors.append(AdvisorInputError(key, f"not a key of the serving space (keys: "
                                                  f"{', '.join([*FIXED_KEYS, *SEARCH_KEYS])})", text))
    for key, kind in FIXED_KEYS.items():
        v = fixed.get(key)
        if v is None:
            errors.append(AdvisorInputError(f"fixed.{key}", "is required", v))
        elif kind == "int" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            errors.append(AdvisorInputError(f"fixed.{key}", "must be a whole number of at least 1", v))
        elif kind == "fraction" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1):
            errors.append(AdvisorInputError(f"fixed.{key}", "must be a number in [0, 1]", v))
    for key, allowed in SEARCH_KEYS.items():
        values = search.get(key)
        if not values:
            errors.append(AdvisorInputError(f"search.{key}", "needs at least one choice", values))
            continue
        for v in values:
            if allowed is None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                errors.append(AdvisorInputError(f"search.{key}", "choices must be whole numbers of at least 1", v))
            elif allowed is not None and v not in allowed:
                errors.append(AdvisorInputError(f"search.{key}", f"choices must be among {', '.join(allowed)}", v))
    for key in set(search) - set(SEARCH_KEYS):
        errors.append(AdvisorInputError(f"search.{key}", NOT_SEARCHED.get(key, "not a knob of the serving space"), key))
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return ServeSpace(name=str(data.get("name", path.stem)), fixed=fixed, search=search, source=str(path))
