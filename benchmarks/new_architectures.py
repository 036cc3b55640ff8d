"""Speed of answering for any architecture, and the simulation of the new ones at real size (issue 24).

Run by hand from the repository root (about 5 minutes on a 2-core machine; every command is a fresh process, as a
user runs it):

    python benchmarks/new_architectures.py [--out reports/new_architectures.md] [--repeat 5]

1. Start-up: ``advisor estimate --model qwen7b --json`` (a catalog model: its description is read from
   advisor/data/architectures_derived.json, no torch), median of ``--repeat`` runs; whether ``estimate --help``
   imports torch.
2. A local config.json of an architecture the catalog does not hold (Qwen3-30B-A3B's published config, which
   carries fields the catalog's entry does not, so it misses the data file): the description cold (a fresh user
   cache: torch, transformers, a meta-device build) and warm (read from the user cache), with ``--task inference``
   (nothing but the description and the serving ledger); then the training estimate, which the simulation answers.
3. The simulation at real size of each new family, through ``advisor estimate`` (the closed form does not describe
   them, so the simulation answers): wall time of the command, the simulation's own seconds, the layers traced,
   the peak and its ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30

REAL_SIZE = [
    ("Qwen3-30B-A3B LoRA attention + checkpointing", ["--model", "qwen30b-a3b", "--method", "lora",
                                                     "--gradient-checkpointing", "--seq-len", "1024"]),
    ("Qwen3-30B-A3B QLoRA + checkpointing", ["--model", "qwen30b-a3b", "--method", "qlora", "--gradient-checkpointing",
                                             "--seq-len", "1024"]),
    ("gpt-oss-20b LoRA all-linear", ["--model", "gpt-oss-20b", "--method", "lora", "--lora-targets", "all-linear",
                                     "--seq-len", "1024"]),
    ("Gemma-3-4B LoRA + checkpointing", ["--model", "gemma-3-4b", "--method", "lora", "--gradient-checkpointing",
                                         "--seq-len", "1024"]),
    ("DeepSeek-V2-Lite LoRA all-linear + checkpointing", ["--model", "deepseek-v2-lite", "--method", "lora",
                                                          "--lora-targets", "all-linear", "--gradient-checkpointing",
                                                          "--seq-len", "1024"]),
    ("Qwen3-Next-80B-A3B LoRA + checkpointing", ["--model", "qwen3-next", "--method", "lora",
                                                 "--gradient-checkpointing", "--seq-len", "1024"]),
]


def advisor(args: list[str], env: dict | None = None) -> tuple[float, dict | None, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, cwd=str(ROOT),
                          env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    data = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip().startswith("{") else None
    return seconds, data, proc.stderr[-2000:]


def startup(repeat: int) -> list[str]:
    times = [advisor(["estimate", "--model", "qwen7b", "--json"])[0] for _ in range(repeat)]
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['advisor', 'estimate', '--help']\n"
                            "from advisor.cli import main\ntry:\n    main(['estimate', '--help'])\nexcept SystemExit:\n"
                            "    pass\nprint('TORCH', 'torch' in sys.modules)"],
                           capture_output=True, text=True, cwd=str(ROOT))
    torch_loaded = "TORCH True" in probe.stdout
    return [f"- `advisor estimate --model qwen7b --json`: median {statistics.median(times):.2f} s over {repeat} runs "
            f"({', '.join(f'{t:.2f}' for t in times)} s)",
            f"- `advisor estimate --help` imports torch: {torch_loaded}"]


def local_config() -> list[str]:
    from advisor.core.catalog import model_catalog

    config = {**model_catalog()["qwen3-30b-a3b"]["config"], "architectures": ["Qwen3MoeForCausalLM"],
              "bos_token_id": 151643, "eos_token_id": 151645}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "Qwen3-30B-A3B-local"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        env = {"ADVISOR_ARCHITECTURE_CACHE": str(Path(tmp) / "cache")}
        cold, data, err = advisor(["estimate", "--model", str(d), "--task", "inference", "--json"], env)
        warm, data2, _ = advisor(["estimate", "--model", str(d), "--task", "inference", "--json"], env)
        train, data3, err3 = advisor(["estimate", "--model", str(d), "--method", "lora", "--gradient-checkpointing",
                                      "--seq-len", "1024", "--json"], env)
        ok = data is not None and data2 is not None
        out.append(f"- description of a local config.json of an architecture outside the data file (Qwen3-30B-A3B's "
                   f"published fields): cold {cold:.2f} s, warm {warm:.2f} s (`--task inference`: the description "
                   f"and the serving ledger){'' if ok else ' FAILED: ' + err}")
        if data3 is not None:
            out.append(f"- its training estimate (LoRA, checkpointing, 1,024 tokens): {train:.2f} s, answered by the "
                       f"{data3['answered_by']}, peak {data3['peak_bytes'] / GIB:.2f} GiB")
        else:
            out.append(f"- its training estimate FAILED: {err3}")
    return out


def real_size() -> list[str]:
    rows = ["| model and plan | answered by | command s | simulation s | layers traced | step peak GiB | phase | "
            "weights | activations | transient | other |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, args in REAL_SIZE:
        seconds, d, err = advisor(["estimate", *args, "--json"])
        if d is None:
            rows.append(f"| {label} | FAILED | {seconds:.1f} | | | | | | | | {err.splitlines()[-1] if err else ''} |")
            continue
        led = d["ledger"]
        other = sum(v for k, v in led.items() if k not in ("weights", "activations", "transient"))
        rows.append(f"| {label} | {d['answered_by']} | {seconds:.1f} | {d['extra'].get('simulation_seconds')} | "
                    f"{d['extra'].get('layers_traced')} | {d['peak_bytes'] / GIB:.2f} | {d['peak_phase']} | "
                    f"{led['weights'] / GIB:.2f} | {led['activations'] / GIB:.2f} | {led['transient'] / GIB:.2f} | "
                    f"{other / GIB:.2f} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "new_architectures.md")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    lines = ["# Answering for any architecture: speed, and the new families simulated at real size", "",
             f"Generated by `python benchmarks/new_architectures.py` ({os.cpu_count()} CPUs; a shared machine, so "
             "times vary by a factor of about 2 between runs).", "", "## Start-up and a new local config", ""]
    lines += startup(args.repeat) + local_config()
    lines += ["", "## The simulation at real size (batch 1, bf16, AdamW; the step's peak with the GPU overhead)", ""]
    lines += real_size()
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
