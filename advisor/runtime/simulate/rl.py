"""The GRPO and DPO training step as TRL 1.16 runs it, under the live-bytes tracker, fake tensors or real.

What runs is TRL's own code: the trainer's ``_compute_loss`` and ``_get_per_token_logps_and_entropies`` (GRPO) and
``_compute_loss`` (DPO: the concatenated chosen + rejected forward, the reference forward inside it, the sigmoid
loss), its fused LM head (``trl.trainer.utils.add_fused_lm_head``: log-probs in tiles of 4,096 tokens x 32,768
vocabulary columns, never the full logits), ``use_adapter`` (the PEFT base with the adapter disabled),
``disable_gradient_checkpointing``, ``shuffle_sequence_dict`` and ``split_tensor_dict``, on a real trainer instance
(advisor.runtime.simulate.rl_trl.host_trainer) whose ``model`` and ``ref_model`` are the simulated ones. The few lines
of ``GRPOTrainer._generate_and_score_completions`` that build the batch and score it are reproduced below, each with
its place in trl/trainer/grpo_trainer.py (1.16); tests/test_simulate_rl.py proves the whole step equal to TRL's real
``GRPOTrainer`` / ``DPOTrainer`` run on the CPU, phase by phase and category by category.

Measurement protocol (runner.py's): build inside the tracker; a warm-up step (optimizer states exist); the measured
step with phase marks:
- ``score`` (GRPO): the no-grad forwards of the generation batch: old log-probs (when TRL computes them: generation
  out of step with the optimizer) and the reference's (beta > 0), in chunks of ``per_device_train_batch_size``;
- ``train``: each micro-batch's forward with the loss and its backward (DPO: the reference's no-grad forward runs
  inside it, after the policy's, while the policy's activations are alive);
- ``optimizer``: gradient clipping, ``optimizer.step()``, ``zero_grad``.
Generation itself is not traced: every completion has ``max_completion_length`` tokens (the step that runs out of
memory when the longest completion arrives) and the rollout's tensors are made as TRL holds them after generating.

Ledger categories (``RL_CATEGORIES``): the training categories, plus ``reference`` (a frozen copy's weights),
``logits`` (what the fused head allocates: its tile and per-token statistics) and ``rollout`` (the generation batch:
ids, masks, advantages and the scored log-probs that live into training).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan, checkpointed_layers, some_checkpointed
from advisor.memory.ledger import CATEGORIES
from advisor.runtime.simulate.rl_trl import RLWorkload

RL_CATEGORIES = (*CATEGORIES, "reference", "logits", "rollout")
MEASURED = ("score", "train", "optimizer")
"""The phases a step is measured in (``generate`` is the rollout's own tensors being made, not measured)."""


@dataclass
class RLPhase:
    phase: str
    bytes: int
    ledger: dict[str, int]


@dataclass
class RLTrace:
    """What one traced (or measured) RL step says about memory."""

    num_layers: int
    peak_bytes: int
    peak_phase: str
    ledger: dict[str, int]
    phases: dict[str, RLPhase]
    seconds: float
    fake: bool
    reference: str
    notes: list[str] = field(default_factory=list)


class Recorder:
    """Phase marks and what each storage is, over one tracker (shared by the simulation and the real TRL run)."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.measuring = False
        self.peaks: dict[str, tuple[int, int]] = {}
        self.saved: set[int] = set()
        self.head: set[int] = set()
        self.rollout: set[int] = set()
        self.forward_begin = 0
        self.ids: dict[str, set[int]] = {"gradients": set(), "optimizer_states": set()}

    def phase(self, name: str) -> None:
        t = self.tracker
        if self.measuring and t.phase in MEASURED:
            best = self.peaks.get(t.phase)
            if best is None or t.peak.bytes > best[0]:
                self.peaks[t.phase] = (t.peak.bytes, t.peak.clock)
        t.phase = name
        t.layer = None
        t.reset_peak()

    def pack(self, x):
        rec = self.tracker.record_of(x)
        if rec is not None:
            self.saved.add(rec.uid)
        return x

    def forward(self) -> None:
        self.forward_begin = self.tracker.clock

    def backward(self) -> None:
        """Whatever the forward made and is still alive is held for backward (runner.py's rule)."""
        for rec in self.tracker.live_at(self.tracker.clock):
            if rec.born > self.forward_begin:
                self.saved.add(rec.uid)

    def mark_rollout(self, *tensors) -> None:
        import torch

        for x in tensors:
            rec = self.tracker.record_of(x) if isinstance(x, torch.Tensor) else None
            if rec is not None:
                self.rollout.add(rec.uid)

    def mark_grads_and_states(self, model, optimizer) -> None:
        from advisor.runtime.simulate.runner import optimizer_state_tensors

        for p in model.parameters():
            rec = self.tracker.record_of(p.grad) if p.grad is not None else None
            if rec is not None:
                self.ids["gradients"].add(rec.uid)
        for v in optimizer_state_tensors(optimizer) if optimizer is not None else ():
            rec = self.tracker.record_of(v)
            if rec is not None:
                self.ids["optimizer_states"].add(rec.uid)

    @contextlib.contextmanager
    def fused_head(self, untracked_fold: bool = False):
        """Storages made inside TRL's fused LM head (``ChunkedLogProbFunction``) are the logits' category.
        ``untracked_fold``: its per-tile fold runs as CUDA's Triton kernel does, allocating nothing (the torch
        twin of the kernel, ``_forward_tile`` / ``_backward_tile``, runs with the tracker paused)."""
        from trl.kernels import chunked_logprob as kernel

        fn = kernel.ChunkedLogProbFunction
        fwd, bwd = fn.forward, fn.backward
        tiles = kernel._forward_tile, kernel._backward_tile
        me = self

        def scoped(inner):
            def run(ctx, *args, **kwargs):
                first = len(me.tracker.records)
                try:
                    return inner(ctx, *args, **kwargs)
                finally:
                    me.head.update(r.uid for r in me.tracker.records[first:])
            return staticmethod(run)

        def paused(inner):
            def run(*args, **kwargs):
                me.tracker.paused += 1
                try:
                    return inner(*args, **kwargs)
                finally:
                    me.tracker.paused -= 1
            return run

        fn.forward, fn.backward = scoped(fwd), scoped(bwd)
        if untracked_fold:
            kernel._forward_tile, kernel._backward_tile = paused(tiles[0]), paused(tiles[1])
        try:
            yield
        finally:
            fn.forward, fn.backward = staticmethod(fwd), staticmethod(bwd)
            kernel._forward_tile, kernel._backward_tile = tiles

    def ledgers(self, groups: dict[int, str]) -> dict[str, RLPhase]:
        """The ledger of every measured phase at its peak."""
        for uid in self.ids["gradients"]:
            groups.setdefault(uid, "gradients")
        for uid in self.ids["optimizer_states"]:
            groups.setdefault(uid, "optimizer_states")
        out = {}
        for name, (nbytes, clock) in self.peaks.items():
            ledger = {c: 0 for c in RL_CATEGORIES}
            for rec in self.tracker.live_at(clock):
                ledger[self.category(rec, groups)] += rec.nbytes
            out[name] = RLPhase(name, nbytes, ledger)
        return out

    def category(self, rec, groups: dict[int, str]) -> str:
        if rec.uid in groups:
            return groups[rec.uid]
        if rec.uid in self.head:
            return "logits"
        if rec.uid in self.rollout or rec.phase == "generate":
            return "rollout"
        if rec.uid in self.saved:
            return "activations"
        return "transient"


def identity_groups(tracker, model, ref, peft: bool, constants) -> dict[int, str]:
    """uid -> category of the parameters, buffers and quantization constants of the policy and the reference."""
    groups: dict[int, str] = {}
    for t in constants:
        rec = tracker.record_of(t)
        if rec is not None:
            groups[rec.uid] = "quant_constants"
    for p in model.parameters():
        rec = tracker.record_of(p)
        if rec is not None:
            groups.setdefault(rec.uid, "adapter_weights" if p.requires_grad and peft else "weights")
    for b in model.buffers():
        rec = tracker.record_of(b)
        if rec is not None:
            groups.setdefault(rec.uid, "weights")
    if ref is not None:
        for t in (*ref.parameters(), *ref.buffers()):
            rec = tracker.record_of(t)
            if rec is not None:
                groups.setdefault(rec.uid, "reference")
    return groups


def trl_model_setup(model, args, plan: Plan) -> None:
    """What TRL's trainer (``GRPOTrainer`` / ``DPOTrainer.__init__``, trl 1.16) and transformers' Trainer do to the
    model after peft wraps it, before training:
    - QLoRA: the adapter weights in bf16 ("When using QLoRA, the PEFT adapter weights are converted to bf16"; the
      optimizer's states, made at its first step, follow);
    - dropout off when ``disable_dropout`` (DPO's default; GRPO keeps it);
    - PEFT with checkpointing: ``enable_input_require_grads``; then Trainer's ``activation_checkpointing_enable``
      (trainer.py 5.24 ``__init__``)."""
    import torch
    from trl.trainer.utils import disable_dropout_in_model

    if plan.quantized and plan.peft:
        for name, p in model.named_parameters():
            if p.requires_grad and "lora_magnitude_vector" not in name:
                p.data = p.data.to(torch.bfloat16)
    if args.disable_dropout:
        disable_dropout_in_model(model)
    if not args.gradient_checkpointing:
        return
    if plan.peft:
        model.enable_input_require_grads()
    kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None) or args.gradient_checkpointing_kwargs or {})
    kwargs.pop("every_n_layers", None)
    offload = kwargs.pop("offload", False)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None, offload=offload)


def make_reference(spec: ModelSpec, plan: Plan, num_layers, device: str, layers=None):
    """A frozen copy of the model: TRL loads the policy's checkpoint again (``create_model_from_path``, in the
    policy's dtype and attention), quantized as the policy is, in eval mode with dropout off."""
    from advisor.runtime.build import _build_model
    from trl.trainer.utils import disable_dropout_in_model

    ref = _build_model(spec, plan, device, num_layers, None, device, [], layers)
    if plan.quantized:
        from advisor.runtime.simulate.standins import quantize_model

        quantize_model(ref, spec, plan, device=device, impl="standin" if _fake(ref) else "bnb", target_device=device)
    for p in ref.parameters():
        p.requires_grad_(False)
    ref.eval()
    disable_dropout_in_model(ref)
    return ref


@contextlib.contextmanager
def unpadded_masks():
    """The step's batches are unpadded (every prompt and completion at its full length): an attention mask of ones,
    which a real run reads and then lets sdpa be causal without a mask (transformers masking_utils
    ``_ignore_causal_mask_sdpa``). A fake mask cannot be read, so decide as the real run does: as if no padding
    mask were given."""
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers import masking_utils

    original = masking_utils._ignore_causal_mask_sdpa

    def ignore(padding_mask, *args, **kwargs):
        return original(None if isinstance(padding_mask, FakeTensor) else padding_mask, *args, **kwargs)

    masking_utils._ignore_causal_mask_sdpa = ignore
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = original


def completion_masks(completion_length: int):
    """Boolean indexing by a completion mask (DPOTrainer's metrics: ``chosen_mean_logits[chosen_mask.bool()]``) has
    an output as long as the mask's true values, which a fake mask does not have. Every completion of the simulated
    step is ``completion_length`` long and every other position is prompt, so a mask of r rows holds
    r x completion_length true values (at most its size): index with that many positions, made as ``nonzero``
    makes them (one int64 per position and dimension)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class CompletionMasks(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten.index.Tensor and any(
                    isinstance(i, FakeTensor) and i.dtype == torch.bool for i in args[1] if i is not None):
                indices = []
                for i in args[1]:
                    if isinstance(i, FakeTensor) and i.dtype == torch.bool:
                        rows = i.numel() // i.shape[-1] if i.dim() else 1
                        count = min(i.numel(), rows * completion_length)
                        positions = torch.zeros((count, max(i.dim(), 1)), dtype=torch.long, device=i.device)
                        indices += list(positions.unbind(1))
                    else:
                        indices.append(i)
                return func(args[0], indices)
            if func in (torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
                        torch.ops.aten._index_put_impl_.default) and any(
                    isinstance(i, FakeTensor) and i.dtype == torch.bool for i in args[1] if i is not None):
                # the backward of the compact head's hidden_states[mask]: scatter into zeros at the true positions
                values = args[2]
                count = values.shape[0] if values.dim() else 1
                indices = []
                for i in args[1]:
                    if isinstance(i, FakeTensor) and i.dtype == torch.bool:
                        positions = torch.zeros((count, max(i.dim(), 1)), dtype=torch.long, device=i.device)
                        indices += list(positions.unbind(1))
                    else:
                        indices.append(i)
                return func(args[0], indices, *args[2:], **kwargs)
            if func is torch.ops.aten.masked_select.default and isinstance(args[1], FakeTensor):
                # the backward of new_zeros(mask.shape).masked_scatter(mask, x): the gradient at the true positions
                mask = args[1]
                rows = mask.numel() // mask.shape[-1] if mask.dim() else 1
                return args[0].new_empty((min(mask.numel(), rows * completion_length),))
            return func(*args, **kwargs)

    return CompletionMasks()


@contextlib.contextmanager
def cuda_head(on: bool, rec: "Recorder"):
    """TRL's fused head as it runs on CUDA (``on``), where it differs from the CPU in memory:
    - only the positions with a label are scored (``add_fused_lm_head``: ``compact = _use_triton(device)``,
      ``hidden_states[mask]``): the completion tokens, not every position of the prompt too;
    - the per-tile fold is a Triton kernel writing in place (no temporaries; its torch twin runs untracked:
      ``Recorder.fused_head(untracked_fold=True)``);
    - the fp32 gradient GEMMs accumulate straight into fp32 (``_addmm_fp32``: ``torch.addmm(..., out_dtype=float32)``
      on CUDA; on the CPU it copies both factors to fp32 first): run untracked too.
    Off: the CPU's own path, which the real CPU run takes (the proof against TRL's trainers)."""
    from trl.kernels import chunked_logprob as kernel
    from trl.trainer import utils

    if not on:
        yield
        return
    use_triton, addmm = utils._use_triton, kernel._addmm_fp32

    def untracked_addmm(acc, a, b):
        rec.tracker.paused += 1
        try:
            addmm(acc, a, b)
        finally:
            rec.tracker.paused -= 1

    utils._use_triton = lambda device: True
    kernel._addmm_fp32 = untracked_addmm
    try:
        with rec.fused_head(untracked_fold=True):
            yield
    finally:
        utils._use_triton, kernel._addmm_fp32 = use_triton, addmm


def prepared(host, model, ref) -> None:
    """What ``accelerator.prepare`` does to the models on one device: with mixed precision (TRL's default bf16=True)
    their forward runs under autocast, outputs in fp32 (accelerate ``Accelerator.prepare_model``; Trainer prepares
    the policy when training starts, TRL's trainers the reference in ``__init__``). The host's accelerator does it
    (no device placement: the tensors stay where they are) and forgets the models again."""
    acc = host.accelerator
    acc.prepare_model(model, device_placement=False)
    if ref is not None:
        acc.prepare_model(ref, device_placement=False, evaluation_mode=True)
    acc._models[:] = [m for m in acc._models if m is not model and m is not ref]


def _fake(model) -> bool:
    from advisor.runtime.tensors import is_fake

    return is_fake(next(iter(model.parameters())))


# --------------------------------------------------------------------------- the step


def grpo_batch(host, plan: Plan, rl: RLWorkload, device: str):
    """The generation batch as TRL holds it after ``generate``: prompt and completion ids and masks of
    ``per_device_train_batch_size x steps_per_generation`` completions (grpo_trainer.py
    ``_generate_and_score_completions``: ``pad`` of the per-sequence lists, masks of ones of dtype long), every
    completion ``max_completion_length`` long."""
    import torch

    n = plan.micro_batch * host.args.steps_per_generation
    P, C = rl.max_prompt_length, rl.max_completion_length
    prompt_ids = torch.full((n, P), 3, dtype=torch.long, device=device)
    prompt_mask = torch.ones((n, P), dtype=torch.long, device=device)
    completion_ids = torch.full((n, C), 3, dtype=torch.long, device=device)
    completion_mask = torch.ones((n, C), dtype=torch.long, device=device)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def grpo_score(host, model, ref, rec: Recorder, batch, reference: str, rl: RLWorkload):
    """The scoring lines of ``GRPOTrainer._generate_and_score_completions`` (trl/trainer/grpo_trainer.py 1.16,
    "Concatenate prompt_mask with completion_mask" through "Compute the per-token log probabilities for the reference
    model"), then the batch as ``_prepare_inputs`` buffers it (``shuffle_sequence_dict``, ``split_tensor_dict``)."""
    import torch
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict, use_adapter

    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    args = host.args
    num_items_in_batch = host.accelerator.gather(completion_mask.sum()).sum()
    prompt_completion_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    logits_to_keep = completion_ids.size(1)
    batch_size = args.per_device_train_batch_size
    rec.mark_rollout(num_items_in_batch, prompt_completion_ids, attention_mask)
    old_per_token_logps = ref_per_token_logps = None
    generate_every = args.steps_per_generation * host.num_iterations
    # with vLLM, TRL also scores them for its importance-sampling correction (vllm_importance_sampling_correction)
    old_scored = args.gradient_accumulation_steps % generate_every != 0 or rl.vllm_sampling
    if old_scored or host.beta != 0.0:
        rec.phase("score")  # (nothing to score on-policy without a reference: no phase)
    with torch.no_grad(), disable_gradient_checkpointing(host.model, args.gradient_checkpointing_kwargs):
        if old_scored:
            old_per_token_logps, _, _ = host._get_per_token_logps_and_entropies(
                host.model, prompt_completion_ids, attention_mask, logits_to_keep, batch_size=batch_size)
            rec.mark_rollout(old_per_token_logps)
        if host.beta != 0.0:
            if reference == "copy":
                ref_per_token_logps, _, _ = host._get_per_token_logps_and_entropies(
                    ref, prompt_completion_ids, attention_mask, logits_to_keep, batch_size=batch_size)
            else:
                with use_adapter(host.model, adapter_name=None):
                    ref_per_token_logps, _, _ = host._get_per_token_logps_and_entropies(
                        host.model, prompt_completion_ids, attention_mask, logits_to_keep, batch_size=batch_size)
            rec.mark_rollout(ref_per_token_logps)
    rec.phase("generate")  # rewards and advantages: the rollout's own small tensors
    advantages = torch.zeros(prompt_ids.size(0), dtype=torch.float32, device=prompt_ids.device)
    output = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages, "num_items_in_batch": num_items_in_batch}
    if old_per_token_logps is not None:
        output["old_per_token_logps"] = old_per_token_logps
    if rl.vllm_sampling:
        # vLLM's sampling log-probs and the importance-sampling ratio from them (fp32, one per completion token)
        output["sampling_per_token_logps"] = torch.zeros_like(old_per_token_logps)
        output["importance_sampling_ratio"] = torch.ones_like(old_per_token_logps)
    if ref_per_token_logps is not None:
        output["ref_per_token_logps"] = ref_per_token_logps
    output = shuffle_sequence_dict(output)
    return split_tensor_dict(output, args.steps_per_generation)


def dpo_batch(plan: Plan, rl: RLWorkload, device: str):
    """DPOTrainer's collated micro-batch: chosen and rejected concatenated along the batch (2 x micro_batch rows of
    prompt + completion, ``DataCollatorForPreference``), with the completion mask; precomputed reference log-probs
    ride along (one per row of chosen and of rejected)."""
    import torch

    rows, L = 2 * plan.micro_batch, rl.max_prompt_length + rl.max_completion_length
    input_ids = torch.full((rows, L), 3, dtype=torch.long, device=device)
    attention_mask = torch.ones((rows, L), dtype=torch.long, device=device)
    completion_mask = torch.cat([torch.zeros((rows, rl.max_prompt_length), dtype=torch.long, device=device),
                                 torch.ones((rows, rl.max_completion_length), dtype=torch.long, device=device)], dim=1)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}
    if rl.reference == "precomputed":
        batch["ref_chosen_logps"] = torch.zeros(plan.micro_batch, dtype=torch.float32, device=device)
        batch["ref_rejected_logps"] = torch.zeros(plan.micro_batch, dtype=torch.float32, device=device)
    return batch


def run_step(host, setup, ref, plan: Plan, rl: RLWorkload, rec: Recorder, reference: str, device: str) -> None:
    """One optimizer step of ``rl``, as transformers' Trainer drives it (trainer.py 5.24 ``_inner_training_loop``,
    ``training_step``): GRPO's rollout and scoring, then ``grad_accum`` micro-batches of ``compute_loss`` and
    backward (DPO: the accumulation window's batches fetched together, ``get_batch_samples``), clipping, the step,
    ``model.zero_grad()``."""
    import torch

    model = setup.model
    rec.phase("generate")
    if rl.task == "grpo":
        batches = grpo_score(host, model, ref, rec, grpo_batch(host, plan, rl, device), reference, rl)
        rec.mark_rollout(*(v for b in batches for v in b.values()))
    else:
        batches = [dpo_batch(plan, rl, device) for _ in range(plan.grad_accum)]
    rec.phase("train")
    for i in range(plan.grad_accum):
        rec.forward()
        loss = host.compute_loss(host.model, batches[i % len(batches)])
        rec.backward()
        loss.backward()  # Trainer: accelerator.backward(loss)
        del loss
    rec.phase("optimizer")
    params = [p for g in setup.optimizer.param_groups for p in g["params"]]
    torch.nn.utils.clip_grad_norm_(params, host.args.max_grad_norm)  # Trainer: accelerator.clip_grad_norm_
    setup.optimizer.step()
    rec.mark_grads_and_states(model, setup.optimizer)
    rec.phase("zero_grad")
    model.zero_grad(set_to_none=True)


def trace_rl_step(spec: ModelSpec, plan: Plan, rl: RLWorkload, *, fake: bool = True, num_layers: int | None = None,
                  target_device: str = "cuda", layers: tuple[int, ...] | None = None) -> RLTrace:
    """Trace warm-up + one measured GRPO / DPO step of ``plan`` and ``rl`` on ``spec`` (``num_layers`` decoder
    layers, or the full model's ``layers``)."""
    import torch
    from torch._subclasses import FakeTensorMode

    from advisor.runtime.simulate.rl_trl import import_trl

    import_trl()
    from trl.trainer.utils import add_fused_lm_head

    from advisor.runtime.build import build_training_setup
    from advisor.runtime.simulate.rl_trl import host_state, host_trainer
    from advisor.runtime.simulate.runner import _decoder_layers, cuda_semantics
    from advisor.runtime.simulate.standins import quant_constant_tensors
    from advisor.runtime.simulate.tracker import LiveBytes

    rl.validate()
    start = time.perf_counter()
    reference = rl.reference_kind(plan.peft)
    if rl.task == "grpo" and reference == "copy" and plan.peft:
        from advisor.core.errors import AdvisorInputError

        raise AdvisorInputError("reference", "TRL's GRPOTrainer scores a PEFT policy's reference with its adapter "
                                "disabled and loads no copy: use adapter", reference)
    host = host_trainer(plan, rl)
    tracker = LiveBytes()
    rec = Recorder(tracker)
    fake_mode = FakeTensorMode() if fake else contextlib.nullcontext()
    notes = []
    masks = completion_masks(rl.max_completion_length) if fake else contextlib.nullcontext()
    on_cuda = target_device.startswith("cuda")
    if on_cuda and not fake:
        raise ValueError("the CUDA head (compact positions) runs under fake tensors only: target_device='cpu' for a "
                         "real run")
    with cuda_semantics(), unpadded_masks(), fake_mode, tracker, masks, rec.fused_head(), cuda_head(on_cuda, rec):
        setup = build_training_setup(spec, plan, device="cpu", num_layers=num_layers, seed=0,
                                     target_device=target_device, layers=layers)
        model = setup.model
        trl_model_setup(model, host.args, plan)
        base = model.get_base_model() if plan.peft else model
        with host_state(host):
            # the fused LM head as each trainer adds it (GRPOTrainer / DPOTrainer __init__, trl 1.16)
            if rl.task == "grpo":
                head = dict(temperature=host.temperature, cast_lm_head_to_fp32=host.args.cast_lm_head_to_fp32,
                            outputs=("log_probs", "entropy"))
                ref_head = dict(temperature=host.temperature, cast_lm_head_to_fp32=host.args.cast_lm_head_to_fp32)
            else:
                outputs = ("log_probs", "entropy", "mean_logits", "is_top1")
                head = dict(outputs=outputs + (("log_sum_sq_probs",) if host.use_weighting else ()))
                ref_head = {}
            add_fused_lm_head(base, **head)
            ref = None
            if reference == "copy":
                ref = make_reference(spec, plan, num_layers, "cpu", layers)
                add_fused_lm_head(ref, **ref_head)
            prepared(host, model, ref)
            saved_model, saved_ref = host.model, host.ref_model
            host.model, host.ref_model = model, ref
            try:
                with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda x: x):
                    run_step(host, setup, ref, plan, rl, rec, reference, "cpu")  # warm-up
                    rec.measuring = True
                    run_step(host, setup, ref, plan, rl, rec, reference, "cpu")  # measured
                    rec.phase("done")
                    rec.measuring = False
            finally:
                host.model, host.ref_model = saved_model, saved_ref
        groups = identity_groups(tracker, model, ref, plan.peft, quant_constant_tensors(model))
        if ref is not None:
            for t in quant_constant_tensors(ref):
                if (r := tracker.record_of(t)) is not None:
                    groups[r.uid] = "reference"
        phases = rec.ledgers(groups)
        n = len(_decoder_layers(model))
        notes += list(setup.notes)
    top = max(phases.values(), key=lambda p: p.bytes)
    return RLTrace(num_layers=n, peak_bytes=top.bytes, peak_phase=top.phase, ledger=top.ledger, phases=phases,
                   seconds=time.perf_counter() - start, fake=fake, reference=reference, notes=notes)


# --------------------------------------------------------------------------- a Plan's simulation, at full depth


def workload_of(plan: Plan) -> RLWorkload:
    """The RL workload of a GRPO / DPO Plan. DPO's ``seq_len`` is DPOConfig.max_length of each of chosen and
    rejected: its first half is taken as prompt, the rest as completion (what the loss scores)."""
    from advisor.core.plan import DPO, effective_beta, generation_steps, uses_reference

    values = vars(plan)
    beta = effective_beta(values)
    reference = plan.reference if uses_reference(values) else "none"
    if plan.task == DPO:
        prompt = plan.seq_len // 2
        return RLWorkload(task="dpo", max_prompt_length=prompt, max_completion_length=plan.seq_len - prompt,
                          beta=beta, reference=reference)
    return RLWorkload(task="grpo", max_prompt_length=plan.max_prompt_length,
                      max_completion_length=plan.max_completion_length, num_generations=plan.num_generations,
                      beta=beta, reference=reference, steps_per_generation=generation_steps(plan),
                      vllm_sampling=plan.generation != "transformers")


@dataclass
class RLSimulation:
    """The simulated step of the full model: every measured phase, traced or extrapolated in depth."""

    phases: dict[str, RLPhase]
    peak_phase: str
    layers_traced: tuple[int, ...]
    extrapolated: bool
    seconds: float
    reference: str
    notes: list[str]


def simulate_rl(spec: ModelSpec, plan: Plan, rl: RLWorkload | None = None, *, layers: str | int = "auto",
                target_device: str = "cuda") -> RLSimulation:
    """Trace the GRPO / DPO step of ``plan`` on ``spec``: whole for shallow models (or ``layers`` of them), else at
    two and three decoder layers, each phase's ledger extended affinely to the full depth (decoder layers are
    identical: advisor.runtime.simulate.extrapolate). Models whose layers are of several kinds are traced whole."""
    from advisor.runtime.simulate.extrapolate import FULL_UP_TO, TRACE_LAYERS, trace_kinds

    rl = rl or workload_of(plan)
    start = time.perf_counter()
    L = spec.num_layers
    whole = layers == "full" or (layers == "auto" and L <= FULL_UP_TO) or isinstance(layers, int)
    notes: list[str] = []
    if not whole and len(trace_kinds(spec, plan)) > 1:
        whole = True
        notes.append(f"layers of several kinds: all {L} traced")
    if not whole and some_checkpointed(plan, L):
        whole = True   # two and three layers would each checkpoint their own share, not the model's pattern
        notes.append(f"{len(checkpointed_layers(plan, L))} of {L} layers checkpointed: all traced")
    if whole:
        n = layers if isinstance(layers, int) and not isinstance(layers, bool) else L
        t = trace_rl_step(spec, plan, rl, num_layers=n, target_device=target_device)
        return RLSimulation(t.phases, t.peak_phase, (n,), False, time.perf_counter() - start, t.reference,
                            t.notes + notes)
    n1, n2 = TRACE_LAYERS
    a = trace_rl_step(spec, plan, rl, num_layers=n1, target_device=target_device)
    b = trace_rl_step(spec, plan, rl, num_layers=n2, target_device=target_device)
    k = (L - n2) / (n2 - n1)
    phases = {}
    for name, pb in b.phases.items():
        pa = a.phases.get(name)
        if pa is None:
            continue
        ledger = {c: max(0, round(pb.ledger[c] + k * (pb.ledger[c] - pa.ledger[c]))) for c in pb.ledger}
        phases[name] = RLPhase(name, sum(ledger.values()), ledger)
    top = max(phases.values(), key=lambda p: p.bytes)
    notes.append(f"traced {n1} and {n2} decoder layers, extrapolated to {L}")
    return RLSimulation(phases, top.phase, (n1, n2), True, time.perf_counter() - start, b.reference, b.notes + notes)


REPORT_CATEGORY = {"reference": "reference_weights", "logits": "transient"}
"""Where the simulation's own categories go in a MemoryReport's ledger (advisor.memory.rl names the reference's
weights ``reference_weights``; the fused head's tile is the step's transient, as the closed form counts it)."""


def rl_report(spec: ModelSpec, plan: Plan, gpu=None, *, layers: str | int = "auto"):
    """The simulate backend's answer for a GRPO / DPO plan: the traced step's peak phase as the ledger, with what
    the trace does not hold added as the closed form counts it (a colocated vLLM's pool during training:
    advisor.memory.rl.vllm_during_training), the GPU's overheads (advisor.memory.overhead), and every traced
    phase's ledger in ``extra["rl_phases"]``."""
    from advisor.memory.ledger import MemoryReport, empty
    from advisor.memory.overhead import overhead_of
    from advisor.memory.rl import generation_of, vllm_during_training

    plan.validate()
    sim = simulate_rl(spec, plan, layers=layers)
    device = {**empty()}
    for c, v in sim.phases[sim.peak_phase].ledger.items():
        key = REPORT_CATEGORY.get(c, c)
        device[key] = device.get(key, 0) + v
    device.pop("overhead", None)
    gen = generation_of(spec, plan, gpu)
    resident = vllm_during_training(gen, plan)
    for c, v in resident.items():
        device[c] = device.get(c, 0) + v
    tensor_peak = sum(device.values())
    over = overhead_of(tensor_peak, gpu)
    device["overhead"] = over.total
    notes = [f"simulated TRL {'GRPO' if plan.task == 'grpo' else 'DPO'}Trainer step (trl 1.16's own loss and fused "
             f"log-prob head, fake tensors), peak in {sim.peak_phase}; reference: {sim.reference}",
             "generation is not traced: its phase is the closed form's (advisor.memory.rl)"] + sim.notes
    if resident:
        notes.append("vLLM's pool during the step from the closed form: " + ", ".join(resident))
    notes += over.notes()
    extra = {"simulation_seconds": round(sim.seconds, 3), "layers_traced": list(sim.layers_traced),
             "extrapolated": sim.extrapolated, "task": plan.task, "reference": sim.reference,
             "phase_peaks": {k: v.bytes for k, v in sim.phases.items()},
             "rl_phases": {k: {"bytes": v.bytes, "ledger": {c: b for c, b in v.ledger.items() if b}}
                           for k, v in sim.phases.items()},
             "generation": gen.to_dict() if gen is not None else None,
             "overhead_parts": over.parts, "overhead_source": over.source}
    return MemoryReport(source="simulated", backend="simulate", device=device, host={**empty()},
                        tensor_peak_bytes=int(tensor_peak), peak_bytes=int(tensor_peak + over.total),
                        peak_phase=sim.peak_phase, notes=tuple(notes), extra=extra)
