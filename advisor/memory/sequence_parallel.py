"""Sequence parallelism: one rank's share of a sequence split over ``sp_degree`` GPUs (docs/multi-gpu.md).

Each rank embeds, runs every linear layer, the MLP and the loss on its own seq_len / P tokens (the ``rank_plan``), so
its ledger is the one-GPU ledger of that shard, plus the exchange around attention:

- Ulysses (Jacobs et al. 2023, DeepSpeed-Ulysses §3; DeepSpeed's ALST UlyssesSPAttentionHF): q, k and v go through an
  all-to-all to the whole sequence with heads / P heads, attention runs there, and its output comes back by a
  second all-to-all. The attention's saved tensors are the same bytes as the shard's with every head; what the rank
  holds beyond them is its position ids (``position_ids_bytes``) and, with more ranks than k/v heads, the replicated
  k/v heads (``kv_replication_bytes``). The exchange's contiguous copies are freed before the MLP makes its
  intermediates, so they are never at the step's peak (traced: advisor.runtime.simulate.sequence_parallel).
- ring (Liu et al. 2023, ring attention; torch context parallel as accelerate's TorchContextParallelConfig runs it,
  cp_comm_strategy "allgather" by default): each rank keeps its queries and gathers the whole sequence's k and v
  for each layer's attention, forward and again in backward, where their gradients are reduce-scattered
  (``ring_exchange_bytes``).

ZeRO and FSDP shard the model state over every GPU of the run, the sequence-parallel ranks included (DeepSpeed's
sequence-data-parallel group, accelerate's dp_shard x sp mesh): advisor.memory.sharding divides by ``--gpus`` as
before. A vision tower is not split (its images are whole on every rank): sequence parallelism of a vision-language
model is refused.
"""

from __future__ import annotations

import math

from advisor.core.catalog import ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import DTYPE_BYTES, Plan, flag_of


INT64_BYTES = 8  # torch.long, the dtype of token positions


def local_seq_len(plan: Plan) -> int:
    """The tokens of the sequence each rank holds: seq_len / P, rounded up (the Trainer pads each sequence to a
    multiple of sp_size: transformers docs, deepspeed_alst.md "pad_to_multiple_of")."""
    return math.ceil(plan.seq_len / plan.sp_degree)


def rank_plan(plan: Plan) -> Plan:
    """The plan one rank runs: its shard of the sequence, no exchange (the one-GPU ledger's plan)."""
    if plan.sp_degree == 1:
        return plan
    return plan.with_(seq_len=local_seq_len(plan), sp_degree=1)


def sequence_parallel_problems(model: ModelSpec, plan: Plan, gpus: int | None = None) -> list[AdvisorInputError]:
    """The rules of ``--sp-degree`` that need the model or the run's GPU count."""
    if plan.sp_degree == 1:
        return []
    flag, p = flag_of("sp_degree"), plan.sp_degree
    out = []
    if gpus is not None and gpus % p:
        out.append(AdvisorInputError(flag, f"must divide --gpus {gpus} (each sequence-parallel group is {p} of the "
                                     "run's GPUs)", p))
    if model.is_vision_language:
        out.append(AdvisorInputError(flag, "sequence parallelism of a vision-language model is not planned: the "
                                     "tower's images are whole on every rank while the token ids are split "
                                     "(ALST's UlyssesSPDataLoaderAdapter shards input_ids, labels and position_ids "
                                     "only)", p))
    heads, kv = model.num_heads, model.num_kv_heads
    if plan.sp_backend == "ulysses":
        if heads % p:
            out.append(AdvisorInputError(flag, f"Ulysses splits the attention heads: {model.name}'s {heads} heads "
                                         f"are not divisible by {p} (transformers docs, deepspeed_alst.md)", p))
        elif kv % p and p % kv:
            out.append(AdvisorInputError(flag, f"Ulysses splits the k/v heads or replicates them: {model.name}'s {kv} "
                                         f"k/v heads neither divide by nor divide {p} (UlyssesSPAttentionHF)", p))
    return out


def sequence_parallel_notes(model: ModelSpec, plan: Plan) -> list[str]:
    """What the ledger of one rank says about what is split and what is not."""
    if plan.sp_degree == 1:
        return []
    how = ("Ulysses all-to-all (DeepSpeed ALST)" if plan.sp_backend == "ulysses"
           else "ring attention (k/v gathered per layer)")
    notes = [f"sequence parallel over {plan.sp_degree} GPUs, {how}: this is one rank's ledger at "
             f"{local_seq_len(plan):,} of the {plan.seq_len:,} tokens; the embeddings, the MLPs and the loss run on "
             "the rank's shard"]
    if model.description is not None and any(layer.attention == "linear" for layer in model.description.layers):
        notes.append("linear-attention layers restart their recurrent state on each rank's shard: accelerate refuses "
                     "such models unless sp_allow_recurrent_layers (DeepSpeedSequenceParallelConfig), because stock "
                     "layers give wrong gradients; memory is counted as each rank runs its shard")
    return notes


def kv_head_replication(model: ModelSpec, plan: Plan) -> int:
    """How many times each k/v head is repeated before the exchange: P / kv heads when the ranks outnumber them
    (UlyssesSPAttentionHF.kv_replication_factor), else 1."""
    if plan.sp_degree == 1 or plan.sp_backend != "ulysses":
        return 1
    return max(1, plan.sp_degree // model.num_kv_heads)


def kv_replication_bytes(model: ModelSpec, plan: Plan) -> int:
    """The saved k and v of one layer beyond the shard's: with more ranks than k/v heads each rank attends with one
    k/v head over the whole sequence, P / kv times the shard's k/v bytes (UlyssesSPAttentionHF._combine_local_sequences
    repeat_interleave)."""
    r = kv_head_replication(model, plan)
    if r == 1:
        return 0
    p = DTYPE_BYTES[plan.activation_dtype]
    return 2 * (r - 1) * p * plan.micro_batch * local_seq_len(plan) * model.kv_dim


def position_ids_bytes(plan: Plan) -> int:
    """The rank's position ids, held through the step: int64, one per token of its shard (the Trainer's collator
    gives them with sequence parallelism, DataCollatorForLanguageModeling return_position_ids; traced)."""
    if plan.sp_degree == 1:
        return 0
    return INT64_BYTES * plan.micro_batch * local_seq_len(plan)


def ring_exchange_bytes(model: ModelSpec, plan: Plan) -> int:
    """One layer's gathered k and v over the whole sequence (cp_comm_strategy allgather: torch context parallel
    all-gathers k and v before its sdpa, forward and in backward), less the rank's own shard."""
    if plan.sp_degree == 1 or plan.sp_backend != "ring":
        return 0
    p = DTYPE_BYTES[plan.activation_dtype]
    return 2 * p * plan.micro_batch * (plan.sp_degree - 1) * local_seq_len(plan) * model.kv_dim
