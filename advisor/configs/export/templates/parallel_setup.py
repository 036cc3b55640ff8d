"""Sequence parallelism for the exported scripts (train.py, train_trl.py), written beside them by vram-advisor.

The config's ``sequence_parallel`` section (``size``, ``backend``) becomes accelerate's ParallelismConfig, which the
Trainer reads from TrainingArguments.parallelism_config: it shards each batch's sequence over the ranks, makes the
position ids and averages the loss over them (transformers docs, deepspeed_alst.md). ``ulysses`` is DeepSpeed's ALST
all-to-all (sp_backend deepspeed, under the DeepSpeed config); ``ring`` is torch context parallel (cp_size, FSDP2).
"""


def parallelism_config(sp: dict, attn):
    from accelerate import ParallelismConfig

    if sp.get("backend", "ulysses") == "ulysses":
        from accelerate.utils import DeepSpeedSequenceParallelConfig

        handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation=attn)
        return ParallelismConfig(sp_backend="deepspeed", sp_size=int(sp["size"]), sp_handler=handler)
    return ParallelismConfig(cp_backend="torch", cp_size=int(sp["size"]))
