"""DeepSpeed ZeRO-2 / ZeRO-3 with CPU offload, in the probe's own process (no launcher, no ssh).

A world of one process is declared through the environment variables torch.distributed reads
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT on a free local port), the process
group is created with ``deepspeed.init_distributed`` (gloo on the CPU, nccl on a GPU), and the
TrainingSetup's model (plan already applied: dtype, LoRA, quantized layers, checkpointing) is
wrapped by ``deepspeed.initialize`` with a config dict. DeepSpeed then owns the optimizer
(DeepSpeedCPUAdam on the offloaded fp32 master weights); the setup's own optimizer is dropped.
On the CPU, DeepSpeed compiles its cpu_adam op the first time (about two minutes, cached
under ~/.cache/torch_extensions).
"""

from __future__ import annotations

import os
import socket
from typing import Any

LR = 1e-4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ds_config(plan: Any) -> dict[str, Any]:
    """The DeepSpeed config of a plan with offload zero2_cpu / zero3_cpu."""
    stage = 2 if plan.offload == "zero2_cpu" else 3
    zero: dict[str, Any] = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    if stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    half = plan.activation_dtype
    return {
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "bf16": {"enabled": half == "bf16"},
        "fp16": {"enabled": half == "fp16"},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "wall_clock_breakdown": False,
        "steps_per_print": 10**9,
    }


class DeepSpeedStepper:
    """micro_step / optimizer_step over a DeepSpeed engine, with the TrainingSetup's signatures."""

    def __init__(self, setup: Any, plan: Any, device: str) -> None:
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                           ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port()))):
            os.environ.setdefault(key, value)
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo" if device == "cpu" else "nccl")
        setup.optimizer = None
        params = [p for p in setup.model.parameters() if p.requires_grad]
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=setup.model, model_parameters=params,
                                                                 config=ds_config(plan))
        self.model = self.engine.module
        self.device = device

    def micro_step(self, input_ids: Any, labels: Any) -> Any:
        dev = self.engine.device
        loss = self.engine(input_ids=input_ids.to(dev), labels=labels.to(dev)).loss
        self.engine.backward(loss)
        self.engine.step()  # steps the optimizer only at the accumulation boundary
        return loss.detach()

    def optimizer_step(self) -> None:
        """Nothing: DeepSpeed steps inside micro_step at the accumulation boundary."""
