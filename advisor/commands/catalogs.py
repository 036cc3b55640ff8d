"""`advisor models` and `advisor gpus`: what the catalogs hold."""

from __future__ import annotations

import argparse
import json


def add_parser(subs) -> None:
    p = subs.add_parser("models", help="list the model catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_models)
    g = subs.add_parser("gpus", help="list the GPU catalog (and the detected GPU)")
    g.add_argument("--json", action="store_true")
    g.set_defaults(run=run_gpus)


def run_models(args: argparse.Namespace) -> int:
    from advisor.core.catalog import model_catalog

    rows = [{"name": k, "hf_id": e["hf_id"], "aliases": e.get("aliases", []), "params_total": e["params_total"],
             "model_type": e["config"]["model_type"]} for k, e in model_catalog().items()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Model catalog")
    for col in ("name", "hub id", "aliases", "parameters", "type"):
        t.add_column(col, justify="right" if col == "parameters" else "left")
    for r in rows:
        t.add_row(r["name"], r["hf_id"], ", ".join(r["aliases"]), f"{r['params_total']:,}", r["model_type"])
    Console().print(t)
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    from advisor.core.catalog import detect_gpu, gpu_catalog, resolve_gpu

    gpus = [resolve_gpu(k) for k in gpu_catalog()]
    detected = detect_gpu()
    if args.json:
        print(json.dumps({"detected": detected.to_dict() if detected else None,
                          "catalog": [g.to_dict() for g in gpus]}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    from advisor.core.units import format_bytes

    t = Table(title="GPU catalog")
    for col in ("key", "name", "memory", "bf16 TFLOP/s", "fp16 TFLOP/s", "GB/s", "host GB/s"):
        t.add_column(col, justify="left" if col in ("key", "name") else "right")
    for g in gpus:
        t.add_row(g.key, g.name, format_bytes(g.memory_bytes, "GiB", 1), str(g.bf16_tflops or "-"),
                  str(g.fp16_tflops), f"{g.mem_bw_gbs:,.0f}", f"{g.host_link_gbs:.0f}")
    console = Console()
    console.print(t)
    console.print(f"Detected: {detected.name} ({format_bytes(detected.memory_bytes, 'GiB')})" if detected
                  else "Detected: no NVIDIA GPU (NVML unavailable)")
    return 0
