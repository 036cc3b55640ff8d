"""TRL's real ``GRPOTrainer`` / ``DPOTrainer`` training a tiny model on the CPU, measured by the live-bytes tracker with
the simulation's own phase marks and categories (advisor.runtime.simulate.rl.Recorder): the ground truth the
simulated step is proven against (tests/test_simulate_rl.py).

The trainer runs two optimizer steps (GRPO with transformers generation, ``use_vllm=False``, every completion forced
to ``max_completion_length`` by ``min_new_tokens``); the second is measured, after the first made the optimizer's
states. Phases are marked on the trainer's own methods: ``_generate_single_turn`` (generate),
``_get_per_token_logps_and_entropies`` without gradients (score), ``compute_loss`` and ``accelerator.backward``
(train), ``_clip_grad_norm`` through ``on_optimizer_step`` (optimizer). The model and optimizer are the Plan's
(advisor.runtime.build), handed to the trainer as a user would hand them.
"""

from __future__ import annotations

import tempfile
import time

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan
from advisor.runtime.simulate.rl import RLTrace, Recorder, identity_groups, make_reference
from advisor.runtime.simulate.rl_trl import RLWorkload, make_trainer


def measure_trl_step(spec: ModelSpec, plan: Plan, rl: RLWorkload, *, num_layers: int | None = None) -> RLTrace:
    """Run TRL's trainer of ``rl`` for two steps on ``spec`` (real tensors, the CPU) and measure the second."""
    import torch
    from transformers import TrainerCallback

    from advisor.runtime.build import build_training_setup, lora_config
    from advisor.runtime.simulate.runner import _decoder_layers, cuda_semantics
    from advisor.runtime.simulate.standins import quant_constant_tensors
    from advisor.runtime.simulate.tracker import LiveBytes

    rl.validate()
    start = time.perf_counter()
    reference = rl.reference_kind(plan.peft)
    tracker = LiveBytes()
    rec = Recorder(tracker)

    class Marks(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 1:
                rec.measuring = True

        def on_optimizer_step(self, args, state, control, **kw):
            rec.mark_grads_and_states(trainer.model, trainer.optimizer)
            rec.phase("zero_grad")

        def on_step_end(self, args, state, control, **kw):
            if rec.measuring:
                rec.phase("done")
                rec.measuring = False

    with tempfile.TemporaryDirectory() as tmp, cuda_semantics(), tracker, rec.fused_head():
        setup = build_training_setup(spec, plan, device="cpu", num_layers=num_layers, seed=0, target_device="cpu",
                                     apply_peft=False)
        model = setup.model
        if plan.quantized:
            _hf_quantizer(model, plan)
        ref = None
        if rl.task == "grpo" and reference == "copy":
            # TRL loads the reference from the policy's checkpoint (create_model_from_path)
            path = f"{tmp}/policy"
            model.save_pretrained(path)
            model.config._name_or_path = path
        elif rl.task == "dpo" and reference == "copy":
            ref = make_reference(spec, plan, num_layers, "cpu")
        trainer = make_trainer(model, plan, rl, f"{tmp}/out", vocab=spec.vocab_size, ref_model=ref, steps=2,
                               peft_config=lora_config(spec, plan) if plan.peft else None)
        model, ref = trainer.model, trainer.ref_model
        for t in (*ref.parameters(), *ref.buffers()) if ref is not None else ():
            tracker.track(t)  # loaded from the checkpoint, partly outside the dispatcher
        trainer.add_callback(Marks())
        _mark_methods(trainer, rec)
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda x: x):
            trainer.train()
        groups = identity_groups(tracker, model, ref, plan.peft, quant_constant_tensors(model))
        phases = rec.ledgers(groups)
        n = len(_decoder_layers(model))
    top = max(phases.values(), key=lambda p: p.bytes)
    return RLTrace(num_layers=n, peak_bytes=top.bytes, peak_phase=top.phase, ledger=top.ledger, phases=phases,
                   seconds=time.perf_counter() - start, fake=False, reference=reference,
                   notes=[f"TRL {type(trainer).__name__}, two steps on the CPU, the second measured"])


def _hf_quantizer(model, plan: Plan) -> None:
    """The quantizer ``from_pretrained(quantization_config=BitsAndBytesConfig(...))`` attaches to the model it loads,
    which transformers' Trainer asks whether the quantization trains (trainer_utils.validate_quantization_for_training);
    the Plan's model is quantized in place (advisor.runtime.simulate.standins.quantize_model), so attach it here."""
    import torch
    from transformers import BitsAndBytesConfig
    from transformers.quantizers import AutoHfQuantizer

    from advisor.runtime.build import torch_dtype

    config = BitsAndBytesConfig(load_in_4bit=plan.four_bit, load_in_8bit=not plan.four_bit,
                                bnb_4bit_quant_type=plan.quantization if plan.four_bit else "nf4",
                                bnb_4bit_use_double_quant=plan.double_quant,
                                bnb_4bit_compute_dtype=torch_dtype(plan.compute_dtype) or torch.bfloat16)
    model.hf_quantizer = AutoHfQuantizer.from_config(config)


def _mark_methods(trainer, rec: Recorder) -> None:
    """Phase marks on the trainer instance's own methods (each wraps the original and calls it)."""
    import torch

    def wrap(name, before=None, after=None):
        original = getattr(trainer, name, None)
        if original is None:
            return

        def run(*args, **kwargs):
            if before is not None:
                before()
            out = original(*args, **kwargs)
            if after is not None:
                after(out)
            return out

        setattr(trainer, name, run)

    def scoring():
        if not torch.is_grad_enabled() and rec.tracker.phase != "score":
            rec.phase("score")

    def scored(out):
        if not torch.is_grad_enabled():
            rec.mark_rollout(out[0])

    def buffered(out):
        batches = getattr(trainer, "_buffered_inputs", None) or [out]
        rec.mark_rollout(*(v for b in batches for v in (b.values() if isinstance(b, dict) else ())))

    def train():
        if rec.tracker.phase != "train":
            rec.phase("train")
        rec.forward()

    wrap("_generate_single_turn", before=lambda: rec.phase("generate"))
    wrap("_get_per_token_logps_and_entropies", before=scoring, after=scored)
    wrap("_prepare_inputs", after=buffered)
    wrap("compute_loss", before=train)
    wrap("_clip_grad_norm", before=lambda: rec.phase("optimizer"))
    backward = trainer.accelerator.backward

    def marked_backward(loss, **kwargs):
        rec.backward()
        return backward(loss, **kwargs)

    trainer.accelerator.backward = marked_backward
