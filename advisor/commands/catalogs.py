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

    rows = [{"name": k, "hf_id": e["hf_id"], "hf_variants": e.get("hf_variants", []), "aliases": e.get("aliases", []),
             "params_total": e["params_total"], "model_type": e["config"]["model_type"]}
            for k, e in model_catalog().items()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console

    from advisor.ui.render import models_table

    Console().print(models_table(rows))
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

    from advisor.core.units import format_bytes
    from advisor.ui.render import gpus_table

    console = Console()
    console.print(gpus_table(gpus))
    console.print(f"Detected: {detected.name} ({format_bytes(detected.memory_bytes, 'GiB')})" if detected
                  else "Detected: no NVIDIA GPU (NVML unavailable)")
    return 0
