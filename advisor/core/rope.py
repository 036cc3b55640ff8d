"""RoPE scaling past a model's trained context: ``--rope-scaling TYPE:FACTOR`` (``yarn:4``, ``linear:2``).

The value is text, ``none`` or ``TYPE:FACTOR``; this module parses it, says the longest sequence it reaches (the
factor times the model's trained context, its ``max_position_embeddings``) and writes the ``rope_parameters`` a
transformers config takes for it (transformers 5.25 modeling_rope_utils ROPE_INIT_FUNCTIONS, one init function per
rope type). A scaling replaces the model's own rope type (Llama-3.1's llama3, Phi-3's longrope): transformers
computes one set of frequencies per attention kind, and the new one is based on the trained context.
Calculation only.
"""

from __future__ import annotations

import math
from typing import Any

from advisor.core.errors import AdvisorInputError

NONE = "none"
FLAG = "--rope-scaling"
TYPES = ("linear", "dynamic", "yarn", "llama3")
"""The rope types a plan scales by (transformers ROPE_INIT_FUNCTIONS; LLaMA-Factory's RopeScaling): linear position
interpolation (Chen et al. 2023, arXiv 2306.15595), dynamic NTK (bloc97 / emozilla; inv_freq recomputed from the
length in each forward), YaRN (Peng et al. 2023, arXiv 2309.00071), Llama-3.1's frequency-band scaling."""
LLAMA3_FREQ_FACTORS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
"""Llama-3.1's band edges (its config.json rope_scaling; LLaMA-Factory model_utils/rope.py writes the same)."""


def parse_rope_scaling(text: Any) -> str:
    """``none`` or ``TYPE:FACTOR`` (a factor >= 1), normalized (``yarn:4``); a one-line error naming the flag."""
    word = str(text).strip().lower()
    if word in ("", NONE):
        return NONE
    kind, _, factor_text = word.partition(":")
    try:
        factor = float(factor_text)
    except ValueError:
        factor = float("nan")
    if kind not in TYPES or not (math.isfinite(factor) and factor >= 1):
        raise AdvisorInputError(FLAG, f"must be none or TYPE:FACTOR with TYPE one of {', '.join(TYPES)} and a "
                                      "FACTOR of at least 1 (yarn:4, linear:2)", text)
    return f"{kind}:{factor:g}"


def rope_type(value: str | None) -> str | None:
    """The scaling's rope type (None: no scaling); ``value`` as a plan or a space file holds it."""
    value = parse_rope_scaling(value or NONE)
    return None if value == NONE else value.split(":")[0]


def rope_factor(value: str | None) -> float:
    """The scaling's factor (1: no scaling)."""
    value = parse_rope_scaling(value or NONE)
    return 1.0 if value == NONE else float(value.split(":")[1])


def scaled_context(context: int, value: str) -> int:
    """The longest sequence a scaling reaches: factor x the trained context (Chen et al. 2023 §2.3: positions
    interpolated by L'/L; Peng et al. 2023 §3.3, s = L'/L with L original_max_position_embeddings)."""
    return int(context * rope_factor(value))


def extend_hint(context: int, seq_len: int) -> str:
    """What a refusal of ``seq_len`` past ``context`` suggests: the smallest whole YaRN factor that reaches it."""
    factor = max(2, math.ceil(seq_len / context))
    return f"{FLAG} yarn:{factor} extends it to {context * factor:,}"


def rope_parameters(current: dict, context: int, value: str) -> tuple[dict, int]:
    """(the ``rope_parameters`` of one attention kind, the config's ``max_position_embeddings``) for ``value`` over
    ``current`` (that kind's parameters as transformers standardized them: rope_theta, partial_rotary_factor kept).
    yarn and llama3 need the trained context as ``original_max_position_embeddings`` (transformers
    _compute_yarn_parameters / _compute_llama3_parameters); dynamic NTK keeps ``max_position_embeddings`` at the
    trained context, the length past which it rescales the base (_compute_dynamic_ntk_parameters)."""
    kind, factor = rope_type(value), rope_factor(value)
    kept = {k: current[k] for k in ("rope_theta", "partial_rotary_factor") if k in current}
    params: dict[str, Any] = {**kept, "rope_type": kind, "factor": factor}
    if kind in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = context
    if kind == "llama3":
        params.update(LLAMA3_FREQ_FACTORS)
    return params, context if kind == "dynamic" else scaled_context(context, value)


def apply_rope_scaling(cfg, context: int, value: str) -> None:
    """Set ``value``'s scaling on a transformers config ``cfg`` (in place), on its full-attention rope where the
    parameters are per layer type (Gemma: sliding windows never see the long positions)."""
    if rope_type(value) is None:
        return
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    nested = cfg.nested_rope_parameter_keys(params) if hasattr(cfg, "nested_rope_parameter_keys") else []
    if nested:
        kinds = ["full_attention"] if "full_attention" in nested else nested
        for k in kinds:
            params[k], longest = rope_parameters(params[k] or {}, context, value)
    else:
        params, longest = rope_parameters(params, context, value)
    cfg.rope_parameters = params
    cfg.max_position_embeddings = longest
    if getattr(cfg, "original_max_position_embeddings", None) is not None:
        # Phi-3 keeps it outside rope_parameters, and standardize_rope_params gives it priority there
        cfg.original_max_position_embeddings = context


__all__ = ["FLAG", "NONE", "TYPES", "apply_rope_scaling", "extend_hint", "parse_rope_scaling", "rope_factor",
           "rope_parameters", "rope_type", "scaled_context"]
