"""The long-context levers of the exported scripts (train.py, train_trl.py), written beside them by vram-advisor.

Sequence parallelism: the config's ``sequence_parallel`` section (``size``, ``backend``) becomes accelerate's
ParallelismConfig, which the Trainer reads from TrainingArguments.parallelism_config: it shards each batch's sequence
over the ranks, makes the position ids and averages the loss over them (transformers docs, deepspeed_alst.md).
``ulysses`` is DeepSpeed's ALST all-to-all (sp_backend deepspeed, under the DeepSpeed config); ``ring`` is torch
context parallel (cp_size, FSDP2).
Tiled MLP: DeepSpeed's TiledMLP on each decoder MLP (``tile_mlps``).
"""

import sys


def say(msg: str) -> None:
    print(f"[long_context_setup] {msg}", flush=True)


def parallelism_config(sp: dict, attn):
    from accelerate import ParallelismConfig

    if sp.get("backend", "ulysses") == "ulysses":
        from accelerate.utils import DeepSpeedSequenceParallelConfig

        handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation=attn)
        return ParallelismConfig(sp_backend="deepspeed", sp_size=int(sp["size"]), sp_handler=handler)
    return ParallelismConfig(cp_backend="torch", cp_size=int(sp["size"]))


def tile_mlps(model) -> int:
    """ALST's tiled MLP (DeepSpeed TiledMLP, as ArcticTraining's tiled_mlp_forward_common wires it): each decoder
    layer's dense gated MLP runs over ceil(seqlen / hidden_size) sequence shards under no_grad, and each shard's
    forward runs again in backward, so one shard's intermediates are alive at a time. Returns how many MLPs."""
    import math
    import types

    import torch

    try:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP
    except ImportError:
        sys.exit("tiled_mlp needs deepspeed (pip install deepspeed): it runs DeepSpeed's TiledMLP")

    def forward(self, x):
        shards = max(1, math.ceil(x.shape[-2] / x.shape[-1]))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every rank runs the same number of shards (ZeRO-3 gathers weights per shard): ALST takes the max
            count = torch.tensor(shards, device=x.device)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            shards = int(count.item())
        return TiledMLP.apply(lambda mlp, part: type(mlp).forward(mlp, part), self, x, shards,
                              list(self.parameters()))

    tiled = 0
    for layer in model.modules():
        mlp = getattr(layer, "mlp", None)
        if hasattr(layer, "self_attn") and all(hasattr(mlp, k) for k in ("gate_proj", "up_proj", "down_proj")):
            mlp.forward = types.MethodType(forward, mlp)
            tiled += 1
    say(f"tiled MLP: DeepSpeed TiledMLP on {tiled} decoder MLP(s)")
    return tiled
