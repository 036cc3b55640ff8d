"""trials.csv: one row per trial of the study, every number beside a column naming its source."""

from __future__ import annotations

import csv
import io
import json

from advisor.memory.ledger import CATEGORIES
from advisor.ui.report._data import ReportData

PLAN_KEYS = ("method", "quantization", "double_quant", "compute_dtype", "precision", "lora_r", "lora_alpha",
             "lora_dropout", "lora_targets", "gradient_checkpointing", "optimizer", "micro_batch", "grad_accum",
             "seq_len", "attn_impl", "offload", "loss", "dora", "packing")
COLUMNS = (["number", "state", "stage", "ladder", "plan_short", "peak_bytes", "run_peak_bytes", "run_peak_phase",
            "tensor_peak_bytes", "host_bytes",
            "host_peak_bytes", "host_peak_phase", "host_pinned_bytes", "host_pageable_bytes", "host_source",
            "memory_source", "tokens_per_s", "tokens_per_s_source", "accuracy_loss", "accuracy_source", "seconds",
            "started", "ended", "winner", "pareto", "reason"]
           + [f"ledger_{c}_bytes" for c in CATEGORIES] + [f"plan_{k}" for k in PLAN_KEYS] + ["losses"])


def render_csv(d: ReportData) -> str:
    times = {t["number"]: t for t in d.timeline}
    best = d.best.number if d.best else None
    front = d.pareto_numbers
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in d.records:
        row = {"number": r.number, "state": r.state, "stage": r.stage, "ladder": r.ladder, "plan_short": r.plan_short,
               "peak_bytes": r.peak_bytes, "run_peak_bytes": r.run_peak_bytes or r.peak_bytes,
               "run_peak_phase": r.run_peak_phase or "train",
               "tensor_peak_bytes": r.tensor_peak_bytes, "host_bytes": r.host_bytes,
               "host_peak_bytes": r.host_peak_bytes, "host_peak_phase": r.host_peak_phase,
               "host_pinned_bytes": r.host_pinned_bytes, "host_pageable_bytes": r.host_pageable_bytes,
               "host_source": r.host_source,
               "memory_source": r.source, "tokens_per_s": r.tokens_per_s, "tokens_per_s_source": r.tokens_per_s_source,
               "accuracy_loss": r.accuracy_loss, "accuracy_source": r.accuracy_source, "seconds": round(r.seconds, 4),
               "started": times.get(r.number, {}).get("started", ""), "ended": times.get(r.number, {}).get("ended", ""),
               "winner": r.number == best, "pareto": r.number in front, "reason": r.reason,
               "losses": json.dumps(r.losses) if r.losses else ""}
        for c in CATEGORIES:
            row[f"ledger_{c}_bytes"] = r.ledger.get(c, "") if r.ledger else ""
        for k in PLAN_KEYS:
            v = r.plan.get(k, "")
            row[f"plan_{k}"] = ",".join(v) if isinstance(v, list) else v
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()
