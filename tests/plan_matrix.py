"""The plan matrix on which the analytic ledger is held to the simulation (tests/test_analytic_vs_simulate.py)."""

from __future__ import annotations

from advisor.core.plan import Plan

MODELS = ("qwen2.5-0.5b-instruct", "qwen2.5-7b-instruct", "qwen2.5-14b-instruct", "llama-3.2-1b-instruct",
          "llama-3.1-8b-instruct", "qwen3-4b", "qwen3-14b", "mistral-7b-v0.3")

_LORA = dict(method="lora")
_QLORA = dict(method="qlora", quantization="nf4")


def analytic_matrix() -> list[tuple[str, Plan]]:
    """(model, plan) pairs: 0.5B to 14B, four architectures, full / LoRA / QLoRA, checkpointing on and
    off, several optimizers, batches and sequence lengths."""
    rows: list[tuple[str, Plan]] = []
    for m in MODELS:
        small = m in ("qwen2.5-0.5b-instruct", "llama-3.2-1b-instruct")
        rows += [
            (m, Plan(seq_len=1024, gradient_checkpointing=True, **_LORA)),
            (m, Plan(seq_len=2048, micro_batch=2, **_LORA, lora_targets="all-linear", optimizer="adamw_8bit")),
            (m, Plan(seq_len=1024, gradient_checkpointing=True, double_quant=True, **_QLORA,
                     lora_targets="all-linear", optimizer="paged_adamw_8bit")),
            (m, Plan(seq_len=512, micro_batch=4, **_QLORA, optimizer="adafactor", lora_dropout=0.0)),
        ]
        if small:
            rows += [
                (m, Plan(method="full", seq_len=1024)),
                (m, Plan(method="full", seq_len=2048, gradient_checkpointing=True, optimizer="adafactor")),
                (m, Plan(method="full", seq_len=512, micro_batch=2, optimizer="sgd", grad_accum=2)),
            ]
    rows += [
        ("qwen2.5-0.5b-instruct", Plan(method="lora", quantization="int8", gradient_checkpointing=True, grad_accum=4,
                                       seq_len=512)),
        ("qwen2.5-0.5b-instruct", Plan(method="full", precision="mixed_bf16", seq_len=512)),
        ("llama-3.2-1b-instruct", Plan(method="lora", chunked_ce=True, gradient_checkpointing=True, seq_len=4096)),
        ("qwen3-4b", Plan(method="lora", attn_impl="eager", seq_len=512, optimizer="sgd")),
    ]
    return rows
