"""TRL's own trainers, built for the RL simulation: a tiny real trainer whose methods run the simulated step, and a
real one-step run on a tiny model that the simulation is proven against.

TRL 1.16's ``GRPOTrainer._compute_loss`` / ``_get_per_token_logps_and_entropies`` and ``DPOTrainer._compute_loss``
read only the trainer's settings (beta, loss type, epsilon, the accelerator's autocast, the reference) and the models
it holds or is handed. The simulation therefore builds the real trainer once on a tiny model (``host_trainer``: its
``__init__`` sets every attribute from the real ``GRPOConfig`` / ``DPOConfig``), points its ``model`` and
``ref_model`` at the simulated ones, and calls those methods: the step's loss and log-prob code is TRL's, not a copy.

The tiny tokenizer is a word-level one built here (one word one id, no downloads); prompts are exactly
``max_prompt_length`` words, so no prompt is padded, as in the simulated step.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass

from advisor.core.errors import AdvisorInputError

TASKS = ("grpo", "dpo")
REFERENCES = ("auto", "none", "adapter", "copy", "precomputed")
HOST_VOCAB = 64
"""Vocabulary of the host trainer's tiny model (its weights are never used by the simulated step)."""
EOS, PAD = 1, 2
"""The tiny tokenizer's end-of-sequence and padding ids."""


@dataclass(frozen=True)
class RLWorkload:
    """The RL or preference workload of one step (what the user trains), apart from the levers in the Plan.

    GRPO: ``micro_batch`` of the Plan counts completions, as TRL's ``per_device_train_batch_size`` does; every
    completion is ``max_completion_length`` long (the step that runs out of memory when a long completion arrives).
    DPO: each of chosen and rejected is a prompt of ``max_prompt_length`` and a completion of
    ``max_completion_length`` tokens, run through the model in one batch of 2 x micro_batch rows."""

    task: str = "grpo"
    max_prompt_length: int = 64
    max_completion_length: int = 64
    num_generations: int = 8
    """GRPO completions per prompt."""
    beta: float = 0.0
    """KL weight (GRPO; 0: no reference) or DPO's temperature of the preference loss."""
    reference: str = "auto"
    """Where the reference's log-probs come from: none (GRPO beta 0), adapter (the PEFT base with the adapter
    disabled), copy (a frozen copy of the model), precomputed (DPO: log-probs computed once before training);
    auto: what TRL does (the disabled adapter for PEFT, a copy otherwise; none when GRPO's beta is 0)."""
    loss_type: str | None = None
    """TRL's loss_type (GRPO: dapo by default; DPO: sigmoid)."""
    steps_per_generation: int | None = None
    """GRPO: micro-batches generated at once (TRL's default: gradient_accumulation_steps)."""
    temperature: float = 1.0
    vllm_sampling: bool = False
    """GRPO with vLLM generation: TRL always scores the old log-probs (its importance-sampling correction against
    vLLM's sampling log-probs, which ride along in the batch)."""

    def validate(self) -> None:
        if self.task not in TASKS:
            raise AdvisorInputError("--task", f"must be one of {', '.join(TASKS)} for the RL simulation", self.task)
        for name in ("max_prompt_length", "max_completion_length", "num_generations"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise AdvisorInputError(f"--{name.replace('_', '-')}", "must be a whole number of at least 1", value)
        if self.reference not in REFERENCES:
            raise AdvisorInputError("reference", f"must be one of {', '.join(REFERENCES)}", self.reference)
        if self.task == "grpo" and self.reference == "precomputed":
            raise AdvisorInputError("reference", "precomputed reference log-probs are DPO's (GRPO scores each new "
                                    "completion)", self.reference)
        if self.task == "grpo" and self.beta == 0 and self.reference not in ("auto", "none"):
            raise AdvisorInputError("--beta", f"0 loads no reference (TRL GRPOTrainer), but the reference is "
                                    f"{self.reference}", self.beta)

    def reference_kind(self, peft: bool) -> str:
        """The reference TRL 1.16 uses: GRPOTrainer/DPOTrainer ``__init__`` (no ``ref_model`` for beta 0 or PEFT)."""
        if self.reference != "auto":
            return self.reference
        if self.task == "grpo" and self.beta == 0:
            return "none"
        return "adapter" if peft else "copy"


def import_trl() -> None:
    """Import TRL and its trainers with stdout sent to stderr: deepspeed, which they import, logs its accelerator
    detection on stdout (a handler made at import holds the stream), and stdout is the JSON of ``--json``."""
    import sys

    with contextlib.redirect_stdout(sys.stderr):
        import trl.trainer.dpo_trainer  # noqa: F401
        import trl.trainer.grpo_trainer  # noqa: F401


def word(i: int) -> str:
    """The tiny tokenizer's word for id ``i``: letters only (a word with digits is split by the tokenizer)."""
    letters = ""
    while True:
        i, d = divmod(i, 26)
        letters += chr(97 + d)
        if i == 0:
            return "w" + letters


def tiny_tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` words (``word``): id 1 ends a sequence, id 2 pads, id 0 is unknown."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({word(i): i for i in range(vocab)}, unk_token=word(0)))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=word(0), eos_token=word(EOS), pad_token=word(PAD))


def _words(n: int, seed: int, vocab: int) -> str:
    return " ".join(word(3 + (seed * 7 + j * 13) % (vocab - 3)) for j in range(n))


def trl_args(plan, rl: RLWorkload, output_dir: str, **extra):
    """The GRPOConfig / DPOConfig of ``plan`` and ``rl`` on the CPU (TRL's defaults for everything else)."""
    from trl import DPOConfig, GRPOConfig

    from advisor.core.optimizers import optimizer as optimizer_declaration

    common = dict(output_dir=output_dir, optim=optimizer_declaration(plan.optimizer).name,
                  per_device_train_batch_size=plan.micro_batch,
                  gradient_accumulation_steps=plan.grad_accum, gradient_checkpointing=plan.gradient_checkpointing,
                  bf16=plan.activation_dtype == "bf16", fp16=plan.activation_dtype == "fp16", report_to=[],
                  use_cpu=True, save_strategy="no", logging_steps=10**6, dataloader_num_workers=0, max_grad_norm=1.0)
    common.update(extra)
    if rl.task == "grpo":
        kw = dict(num_generations=rl.num_generations, max_completion_length=rl.max_completion_length, beta=rl.beta,
                  temperature=rl.temperature, use_vllm=False,
                  steps_per_generation=rl.steps_per_generation or plan.grad_accum,
                  generation_kwargs={"min_new_tokens": rl.max_completion_length})
        if rl.loss_type:
            kw["loss_type"] = rl.loss_type
        return GRPOConfig(**common, **kw)
    kw = dict(beta=rl.beta or 0.1, max_length=rl.max_prompt_length + rl.max_completion_length,
              precompute_ref_log_probs=rl.reference == "precomputed")
    if rl.loss_type:
        kw["loss_type"] = [rl.loss_type]
    return DPOConfig(**common, **kw)


def grpo_dataset(rl: RLWorkload, prompts: int, vocab: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [_words(rl.max_prompt_length, i, vocab) for i in range(prompts)]})


def dpo_dataset(rl: RLWorkload, rows: int, vocab: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [_words(rl.max_prompt_length, i, vocab) for i in range(rows)],
                              "chosen": [_words(rl.max_completion_length, 100 + i, vocab) for i in range(rows)],
                              "rejected": [_words(rl.max_completion_length, 200 + i, vocab) for i in range(rows)]})


def reward_length(completions, **_kwargs):
    """The tiny run's reward: a completion's length (any reward gives the same memory)."""
    return [float(len(c)) for c in completions]


def make_trainer(model, plan, rl: RLWorkload, output_dir: str, *, vocab: int, optimizer=None, ref_model=None,
                 steps: int = 2, tokenizer=None, peft_config=None):
    """The real TRL trainer of ``rl`` over ``model`` (a Plan-built model; its base with ``peft_config`` for the trainer
    to wrap, as TRL's examples pass it), with ``optimizer`` when given (else the trainer builds ``plan.optimizer``)."""
    from trl import DPOTrainer, GRPOTrainer

    tok = tokenizer or tiny_tokenizer(vocab)
    args = trl_args(plan, rl, output_dir, max_steps=steps)
    optimizers = (optimizer, None) if optimizer is not None else (None, None)
    if rl.task == "grpo":
        per_step = plan.micro_batch * (rl.steps_per_generation or plan.grad_accum)
        prompts = max(1, (per_step // rl.num_generations)) * (steps + 1)
        return GRPOTrainer(model=model, reward_funcs=reward_length, args=args, processing_class=tok,
                           train_dataset=grpo_dataset(rl, prompts, vocab), optimizers=optimizers,
                           peft_config=peft_config)
    rows = plan.micro_batch * plan.grad_accum * (steps + 1)
    return DPOTrainer(model=model, ref_model=ref_model, args=args, processing_class=tok,
                      train_dataset=dpo_dataset(rl, rows, vocab), optimizers=optimizers, peft_config=peft_config)


_HOSTS: dict = {}


def host_trainer(plan, rl: RLWorkload):
    """A real TRL trainer on a tiny real PEFT model, built with the settings of ``plan`` and ``rl``, whose methods
    the simulated step calls (its own model is never run). Cached per settings."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import_trl()
    key = (rl.task, plan.micro_batch, plan.grad_accum, plan.gradient_checkpointing, plan.activation_dtype,
           plan.optimizer, rl)
    if key in _HOSTS:
        return _HOSTS[key]
    cfg = Qwen2Config(vocab_size=HOST_VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      eos_token_id=EOS, pad_token_id=PAD)
    with torch.device("cpu"):
        tiny = Qwen2ForCausalLM(cfg)
    tiny = get_peft_model(tiny, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    host_rl = rl if rl.reference != "precomputed" else RLWorkload(**{**rl.__dict__, "reference": "adapter"})
    import sys

    # stdout to stderr: deepspeed, imported while the trainer is built, logs on stdout (the JSON of --json)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        trainer = make_trainer(tiny, plan, host_rl, tmp, vocab=HOST_VOCAB, steps=1)
    trainer.current_gradient_accumulation_steps = plan.grad_accum  # set by Trainer's training loop
    if rl.task == "dpo":
        trainer.precompute_ref_logps = rl.reference == "precomputed"
    else:
        trainer.use_vllm = rl.vllm_sampling  # the loss weighs each token by vLLM's importance-sampling ratio
    trainer._accelerate_state = _accelerate_state()
    _HOSTS[key] = trainer
    return trainer


def _accelerate_state():
    from accelerate.state import AcceleratorState, GradientState, PartialState

    return [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]


@contextlib.contextmanager
def host_state(host):
    """accelerate keeps one process-wide state (its mixed precision, which ``accelerator.autocast`` reads), which
    building ``TrainingArguments`` (a Plan's optimizer) or another trainer resets: the host trainer's state while
    its methods run, the one before afterwards."""
    before = _accelerate_state()
    for cls, state in host._accelerate_state:
        cls._shared_state.clear()
        cls._shared_state.update(state)
    try:
        yield
    finally:
        for cls, state in before:
            cls._shared_state.clear()
            cls._shared_state.update(state)
