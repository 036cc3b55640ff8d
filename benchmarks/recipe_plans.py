"""A published recipe (../shared/published_runs/recipes.json) as the advisor sees it: its model and card
mapped to the advisor's catalogs, its configuration expressed as a Plan (and what the Plan cannot
express), and its published peak with the counter it was read on. The free-text mappings are data:
benchmarks/answers_vs_recipes.yaml. Used by benchmarks/answers_vs_recipes.py.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from advisor.core.catalog import GpuSpec, ModelSpec, resolve_gpu, resolve_model  # noqa: E402
from advisor.core.errors import AdvisorInputError  # noqa: E402
from advisor.core.plan import ALL_LINEAR, Plan  # noqa: E402

TABLES = ROOT / "benchmarks" / "answers_vs_recipes.yaml"
GiB, GB = 2**30, 1e9


def recipes_candidates() -> list[Path]:
    env = os.environ.get("ADVISOR_PUBLISHED_RUNS")
    out = [Path(env) / "recipes.json"] if env else []
    return out + [ROOT.parent / "shared" / "published_runs" / "recipes.json",
                  ROOT.parent.parent / "shared" / "published_runs" / "recipes.json",
                  Path("/work/shared/published_runs/recipes.json")]


def load_tables(path: Path = TABLES) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_recipes(path: Path | None = None) -> list[dict]:
    path = path or next((p for p in recipes_candidates() if p.is_file()), None)
    if path is None:
        raise AdvisorInputError("--recipes-file", "published_runs/recipes.json not found", None, show_value=False)
    return json.loads(Path(path).read_text(encoding="utf-8"))


@dataclass
class Expression:
    """One recipe mapped to the advisor's catalogs and expressed as a Plan."""

    recipe: dict
    model: ModelSpec | None = None
    model_note: str = ""
    gpu: GpuSpec | None = None
    gpu_note: str = ""
    plan: Plan | None = None
    cannot: list[str] = field(default_factory=list)
    """What the recipe does that the Plan cannot express."""
    seq_assumed: bool = False
    counter: str | None = None
    counter_why: str = ""
    published_peak_bytes: float | None = None
    published_peak_text: str = ""
    published_tokens_per_s: float | None = None
    published_oom: bool = False

    @property
    def rid(self) -> str:
        return str(self.recipe["id"])

    @property
    def measured_on_card(self) -> bool:
        """Measured running on the card the recipe names (a published peak, speed or time; not an OOM)."""
        r = self.recipe
        ran = bool(r.get("measured")) and not self.published_oom
        return str(r.get("claim", "")).startswith("measured") and ran and self.gpu is not None

    @property
    def askable(self) -> bool:
        return self.model is not None and self.gpu is not None and self.plan is not None


def _first(rules: list[dict], text: str | None) -> dict | None:
    low = (text or "").lower()
    return next((r for r in rules if r["match"].lower() in low), None)


def map_model(name: str, tables: dict) -> tuple[ModelSpec | None, str]:
    equiv = tables.get("model_equivalents", {}).get(name)
    try:
        if equiv:
            return resolve_model(equiv["catalog"]), f"{name} as {equiv['catalog']}: {' '.join(equiv['why'].split())}"
        return resolve_model(name), ""
    except AdvisorInputError:
        return None, f"{name} is not in the model catalog"


def map_gpu(text: str | None, tables: dict) -> tuple[GpuSpec | None, str]:
    rule = _first(tables["cards"], text)
    if rule is None:
        return None, f"card {text!r} is not in the GPU catalog" if text and "not" not in text.lower() \
            else f"no card named ({text})"
    return resolve_gpu(rule["gpu"]), rule.get("why", "")


def _targets(lora: dict, tables: dict, cannot: list[str]) -> tuple[str, ...] | str:
    names = tables["lora_targets"]
    raw = lora.get("targets")
    if lora.get("modules_to_save"):
        cannot.append(f"fully trained {', '.join(lora['modules_to_save'])} (modules_to_save)")
    if isinstance(raw, str):
        text = raw.lower()
        if "all" in text and "linear" in text or "(all)" in text:
            if "head" in text:
                cannot.append("LoRA on the output head")
            return ALL_LINEAR
        raw = [t.strip() for t in re.split(r"[,\s]+", text) if t.strip()]
    out: list[str] = []
    for t in raw or []:
        key = t.strip().lower()
        if key == "mlp":
            out += tables["mlp_targets"]
        elif key == "head":
            cannot.append("LoRA on the output head")
        elif key in names:
            out.append(names[key])
        else:
            cannot.append(f"LoRA target {t!r}")
    if lora.get("mlp"):
        out += tables["mlp_targets"]
    if lora.get("output") or lora.get("head"):
        cannot.append("LoRA on the output head")
    uniq = tuple(dict.fromkeys(out))
    return ALL_LINEAR if set(uniq) >= {"q_proj", "k_proj", "v_proj", "o_proj", *tables["mlp_targets"]} else uniq


def express_plan(recipe: dict, tables: dict) -> tuple[Plan, list[str], bool]:
    """(the Plan closest to the recipe, what it cannot express, whether the sequence length was assumed)."""
    cannot: list[str] = []
    method = str(recipe.get("method") or "").lower()
    if method.startswith("lora and qlora"):
        cannot.append("the QLoRA variant measured beside it (the LoRA one is expressed)")
        method = "lora"
    quant = recipe.get("quant") or {}
    fields: dict[str, Any] = {"method": "full" if method.startswith("full")
                              else "qlora" if "qlora" in method else "lora"}
    if fields["method"] == "qlora":
        qtype = str(quant.get("type", "nf4")).lower()
        fields["quantization"] = "fp4" if "fp4" in qtype else "nf4"
        dq = quant.get("double_quant")
        fields["double_quant"] = bool(dq) and str(dq).lower() not in ("false", "no")
        if "torchao" in qtype:
            cannot.append("torchao NF4 (expressed as bitsandbytes nf4)")
    lora = recipe.get("lora") or {}
    if fields["method"] != "full":
        fields.update(lora_r=int(lora.get("r", 16)), lora_alpha=float(lora.get("alpha") or 2 * int(lora.get("r", 16))),
                      lora_dropout=float(lora.get("dropout") or 0.0), lora_targets=_targets(lora, tables, cannot))
    ckpt = recipe.get("grad_ckpt")
    fields["gradient_checkpointing"] = bool(ckpt) and str(ckpt).lower() not in ("false", "no")
    opt = _first(tables["optimizers"], recipe.get("optimizer"))
    if opt is None:
        cannot.append(f"optimizer {recipe.get('optimizer')!r}")
    else:
        fields["optimizer"] = opt["plan"]
    if (recipe.get("extra") or {}).get("optimizer_in_bwd"):
        fields["optimizer_in_backward"] = True
    fields["micro_batch"] = int(recipe.get("micro_batch") or 1)
    fields["grad_accum"] = int(recipe.get("grad_accum") or 1)
    seq = recipe.get("max_seq_len")
    fields["seq_len"] = int(seq or tables["unstated_seq_len"])
    fields["packing"] = bool(recipe.get("packing"))
    attn = _first(tables["attention"], recipe.get("attn_impl"))
    fields["attn_impl"] = attn["plan"] if attn else "sdpa"
    loss = _first(tables["losses"], recipe.get("loss_kernel"))
    fields["loss"] = loss["plan"] if loss else "plain"
    fields["activation_offload"] = bool(recipe.get("activation_offload"))
    dtype = str(recipe.get("dtype") or "bf16").lower()
    fields["precision"] = "fp16" if dtype.startswith("fp16") else "bf16"
    fields["compute_dtype"] = fields["precision"]
    if recipe.get("compile"):
        cannot.append("torch.compile")
    project = str(recipe.get("source_project", "")).lower()
    if "torchtune" in project:
        cannot.append("torchtune's own model code, LoRA layers and training loop")
    elif "litgpt" in project:
        cannot.append("litgpt's own model code (fused qkv) and LoRA layers")
    if loss and loss["plan"] == "fused-linear" and "liger" in str(recipe.get("loss_kernel", "")).lower():
        cannot.append("Liger's other fused kernels (RoPE, RMSNorm, SwiGLU)")
    return Plan(**fields), cannot, seq is None


def published_peak(recipe: dict, tables: dict) -> tuple[float | None, str, str | None, str, bool]:
    """(bytes, as printed, counter, why, OOM) of the recipe's published peak."""
    m = recipe.get("measured") or {}
    rule = next((c for c in tables["counters"] if c["source"] in str(recipe.get("source_project", "")).lower()
                 and c.get("path", "") in str(recipe.get("path", ""))), None)
    counter, why = (rule["counter"], rule["why"]) if rule else (None, "")
    for key, value in m.items():
        if isinstance(value, str) and value.strip().upper() == "OOM":
            return None, "OOM", counter, why, True
        if not key.startswith(("peak_mem", "peak_active", "lora_peak")):
            continue
        if isinstance(value, dict):  # a cumulative ladder: the recipe is its last full fine-tuning row
            full_rows = [k for k in value if k not in ("lora", "qlora")]
            value = value[full_rows[-1]]
        if isinstance(value, str):
            num = float(re.findall(r"[\d.]+", value)[0])
            unit = GiB if "gib" in value.lower() else GB
        else:
            num, unit = float(value), GiB if key.endswith("gib") else GB
        return num * unit, f"{num:g} {'GiB' if unit == GiB else 'GB'}", counter, why, False
    return None, "", counter, why, False


def published_speed(recipe: dict) -> float | None:
    m = recipe.get("measured") or {}
    t = m.get("tokens_per_s")
    if isinstance(t, dict):
        full_rows = [k for k in t if k not in ("lora", "qlora")]
        t = t[full_rows[-1]]
    return float(t) if isinstance(t, (int, float)) else None


def express(recipe: dict, tables: dict) -> Expression:
    ex = Expression(recipe)
    ex.model, ex.model_note = map_model(recipe["model"], tables)
    ex.gpu, ex.gpu_note = map_gpu(recipe.get("target_gpu"), tables)
    ex.plan, ex.cannot, ex.seq_assumed = express_plan(recipe, tables)
    problems = ex.plan.problems()
    if problems:
        ex.cannot.append("as a Plan: " + "; ".join(p.rule for p in problems))
        ex.plan = None
    (ex.published_peak_bytes, ex.published_peak_text, ex.counter, ex.counter_why,
     ex.published_oom) = published_peak(recipe, tables)
    ex.published_tokens_per_s = published_speed(recipe)
    return ex
