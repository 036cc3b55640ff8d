"""RoPE scaling in the exports (--rope-scaling, advisor.core.rope): the model-config override each tool takes, and
the plan's value read back from it.

advisor.yaml's ``model`` section, TRL's ``model_init_kwargs`` and axolotl's ``model_config`` carry the same two
config fields: ``rope_parameters`` (transformers 5's, as the config standardizes them: rope_theta kept, the
scaled type, its factor, the trained context as ``original_max_position_embeddings`` for yarn / llama3) and
``max_position_embeddings`` (factor x the trained context; dynamic NTK's stays the trained context, the length past
which it rescales). from_pretrained applies both to the loaded config (PreTrainedConfig.from_dict sets every
kwarg the config has); axolotl sets each on the config (loaders/utils.py load_model_config,
``overrides_of_model_config``). LLaMA-Factory computes its factor itself (advisor.configs._llamafactory).
"""

from __future__ import annotations

from typing import Any

from advisor.core.rope import NONE, TYPES, apply_rope_scaling, parse_rope_scaling

FIELDS = ("rope_parameters", "max_position_embeddings")
"""The config fields a rope scaling overrides."""


def rope_overrides(spec, plan) -> dict[str, Any]:
    """The config fields of ``plan``'s rope scaling on ``spec`` ({} without one), from the model's transformers
    config with the scaling applied as the training step applies it (advisor.runtime.build.hf_config)."""
    if plan.rope_scaling == NONE:
        return {}
    from advisor.core.architecture import hf_config as text_config
    from advisor.core.catalog import build_hf_config

    cfg = text_config(build_hf_config(spec.config))
    apply_rope_scaling(cfg, spec.max_position_embeddings, plan.rope_scaling)
    return {"rope_parameters": _plain(cfg.rope_parameters), "max_position_embeddings": int(cfg.max_position_embeddings)}


def _plain(value: Any) -> Any:
    """YAML-safe copies (floats, ints, strings, dicts)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def read_rope(section: dict | None, where: str, c) -> str:
    """The plan's --rope-scaling from the override ``section`` (advisor.yaml's model, TRL's model_init_kwargs,
    axolotl's model_config): its ``rope_parameters``' type and factor (a per-layer-type dict: its full-attention
    entry); none without one."""
    params = (section or {}).get("rope_parameters") if isinstance(section, dict) else None
    if params is None:
        return NONE
    if not isinstance(params, dict):
        c.bad(f"{where}.rope_parameters", "must be a mapping with rope_type and factor", params)
        return NONE
    if "rope_type" not in params and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return NONE
    if kind not in TYPES:
        c.bad(f"{where}.rope_parameters.rope_type", f"only {', '.join(TYPES)} are planned", kind)
        return NONE
    try:
        return parse_rope_scaling(f"{kind}:{params.get('factor')}")
    except ValueError as e:
        c.bad(f"{where}.rope_parameters.factor", getattr(e, "rule", str(e)), params.get("factor"))
        return NONE


__all__ = ["FIELDS", "read_rope", "rope_overrides"]
