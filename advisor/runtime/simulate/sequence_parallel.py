"""One rank of a sequence-parallel step, traced: DeepSpeed's own Ulysses attention (ALST ``UlyssesSPAttentionHF``,
registered with transformers as accelerate and the Trainer register it) on the rank's shard of the sequence, its
all-to-alls run by a process group of ``sp_degree`` ranks.

The group is the one already running (a real gloo run of every rank: tests/test_sequence_parallel.py), or else
PyTorch's fake process group (torch.testing._internal.distributed.fake_pg: collectives that return at once, on tensors
of the right shapes), in which rank 0 runs alone. DeepSpeed's all-to-all is a custom op with a fake kernel
(deepspeed/sequence/layer.py ``dim_zero_all_to_all``), so it traces on fake tensors like any other op.

Ring attention (torch context parallel) is not traced here: torch's ring dispatches the CUDA sdpa kernels only
(torch/distributed/tensor/experimental/_context_parallel/_attention.py), which the CPU has none of; a ring plan is
traced as its rank's shard with the ring's k/v exchange counted by the closed form (advisor.memory.sequence_parallel).
"""

from __future__ import annotations

import contextlib

from advisor.core.plan import Plan


@contextlib.contextmanager
def ulysses_rank(model, plan: Plan):
    """Within it ``model`` runs rank 0's attention of a Ulysses group of ``plan.sp_degree`` ranks (nothing changes
    for a plan without sequence parallelism, or a ring plan)."""
    if plan.sp_degree == 1 or plan.sp_backend != "ulysses":
        yield
        return
    import torch.distributed as dist
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    own = not dist.is_initialized()
    if own:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.sp_degree)
    import deepspeed.comm
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    deepspeed.comm.init_distributed(dist_backend=dist.get_backend(), verbose=False)
    impl = model.config._attn_implementation
    original = ALL_ATTENTION_FUNCTIONS[impl]
    try:
        # as accelerate's Accelerator._prepare_deepspeed registers it: variable lengths, the plan's micro-batch
        UlyssesSPAttentionHF.register_with_transformers(model, impl, plan.sp_degree, plan.micro_batch,
                                                        seq_length_is_variable=True)
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS[impl] = original
        mpu._release_sequence_parallel_groups()
        if own:
            dist.destroy_process_group()
