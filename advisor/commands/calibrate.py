"""`advisor calibrate`: measure this GPU's overheads (CUDA context, cuBLAS workspace, reserved vs allocated).

Runs, each in a fresh child process: one measurement of an idle CUDA process
(advisor.runtime.probe._memory.measure_overheads), then a few short real training probes of a small
model (random weights, a few decoder layers). Each run's figures go into the calibration file
(advisor.memory.calibration), which later predictions on this GPU use and name: "calibrated on
<GPU> (N probes)".
"""

from __future__ import annotations

import argparse
import json

from advisor.commands.common import number, positive_int

# the short probe set: a small architecture, two memory regimes (bf16 LoRA, 4-bit QLoRA + checkpointing)
PROBE_PLANS = (
    {"method": "lora", "seq_len": 512, "micro_batch": 2},
    {"method": "qlora", "quantization": "nf4", "gradient_checkpointing": True, "seq_len": 1024, "micro_batch": 1},
)


def add_parser(subs) -> None:
    p = subs.add_parser(
        "calibrate", help="measure this GPU's CUDA context, cuBLAS workspace and allocator overhead",
        description="Measure what this GPU's processes hold beyond their tensors (CUDA context, cuBLAS "
                    "workspace, caching-allocator reserve) with a short set of real probes, and store it per GPU "
                    "model and torch/driver version for later predictions.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="qwen0.5b", help="architecture of the probes (random weights)")
    p.add_argument("--probes", type=positive_int, default=len(PROBE_PLANS),
                   help="training probes to run (cycling through a LoRA and a QLoRA plan)")
    p.add_argument("--num-layers", type=positive_int, default=4, help="decoder layers the probes build")
    p.add_argument("--timeout", type=number(low=0), default=300.0, help="seconds per probe")
    p.add_argument("--calibration", metavar="FILE",
                   help="calibration file (default: $ADVISOR_MEMORY_CALIBRATION or "
                        "~/.cache/vram-advisor/memory_calibration.json)")
    p.add_argument("--json", action="store_true", help="print the calibration as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import os
    import subprocess
    import sys
    from pathlib import Path

    from advisor.core.catalog import detect_gpu, resolve_model
    from advisor.core.errors import AdvisorInputError
    from advisor.core.plan import Plan
    from advisor.memory import calibration as cal

    gpu = detect_gpu()
    if gpu is None:
        raise AdvisorInputError("calibrate", "needs an NVIDIA GPU in this machine; NVML finds none",
                                "no GPU", show_value=False)
    spec = resolve_model(args.model)
    path = args.calibration or cal.default_path()
    env = dict(os.environ)  # this advisor in the child, as the probe runner does (and $ADVISOR_CUDA_DOUBLE with it)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                         *filter(None, [env.get("PYTHONPATH")])])
    try:
        child = subprocess.run([sys.executable, "-m", "advisor.runtime.probe._overheads"], capture_output=True,
                               text=True, timeout=args.timeout, env=env)
        lines = (child.stdout or "").strip().splitlines()
        measured = json.loads(lines[-1]) if lines else {"error": (child.stderr or "").strip()[-300:]}
    except subprocess.TimeoutExpired:
        measured = {"error": f"no answer within --timeout {args.timeout:g} s"}
    except ValueError:
        measured = {"error": f"unreadable answer: {lines[-1][:200]}"}
    if "error" in measured:
        raise AdvisorInputError("calibrate", f"the CUDA measurement failed: {measured['error']}", None,
                                show_value=False)
    v = measured.get("versions", {})
    probes = [cal.OverheadProbe(gpu=measured["gpu"], cuda_context_bytes=measured["cuda_context_bytes"],
                                cublas_workspace_bytes=measured["cublas_workspace_bytes"], torch=v.get("torch"),
                                cuda=v.get("cuda"), driver=v.get("driver"), workload="idle process, first matmul",
                                time=__import__("time").time())]
    failed = []
    from advisor.runtime.probe import run_probe

    for i in range(args.probes):
        plan = Plan(**PROBE_PLANS[i % len(PROBE_PLANS)])
        result = run_probe(spec, plan, device="cuda", steps=2, warmup=1, timeout=args.timeout,
                           num_layers=args.num_layers)
        one = cal.OverheadProbe.from_probe(result.to_dict()) if result.ok else None
        if one is None:
            failed.append(f"{plan.method} seq {plan.seq_len}: {result.status} {result.message}".strip())
            continue
        probes.append(one)
    cal.record(probes, path)
    c = cal.calibration_for(measured["gpu"], torch_version=v.get("torch"), path=path)
    if args.json:
        print(json.dumps({"calibration": c.to_dict() if c else None, "file": str(path),
                          "probes": [p.__dict__ for p in probes], "failed": failed}, indent=2))
        return 0 if not failed else 1
    mib = 1 << 20
    print(f"{c.label} [measured]: CUDA context {c.cuda_context_bytes / mib:.0f} MiB, cuBLAS workspace "
          + (f"{c.cublas_workspace_bytes / mib:.0f} MiB" if c.cublas_workspace_bytes is not None else "n/a")
          + (f", reserved/allocated {c.reserved_over_allocated:.3f}" if c.reserved_over_allocated else "")
          + f"; torch {c.torch}, driver {c.driver}")
    print(f"written to {path}")
    for f in failed:
        print(f"probe failed: {f}")
    return 0 if not failed else 1
