"""Gather the checks of a preflight and give the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.data_files import load_data_file
from advisor.core.fit import HEADROOM, fit_verdict, fits
from advisor.core.target import Target, resolve_target
from advisor.diagnosis.doctor import ledger_over
from advisor.diagnosis.findings import Finding, verdict
from advisor.memory.ledger import LABELS, MemoryReport
from advisor.core.plan import Plan
from advisor.diagnosis.preflight import _config, _env, _longest, _rl, _vision
from advisor.diagnosis.preflight._data import DataStats, data_stats
from advisor.core.units import Budget, format_bytes


@dataclass(frozen=True)
class PreflightInput:
    config: str
    gpu_budget: str | None = None
    gpu: str | None = None
    data: str | None = None
    probe: bool = False
    max_seq_len: int | None = None
    seq_len: int | str | None = None
    """--seq-len: a length (as ``max_seq_len``), or max: the longest the config's plan fits (advisor.memory.longest)."""
    headroom: float = HEADROOM
    epochs: float | None = None
    trust_remote_code: bool = False
    backend: str = "simulate"
    """How the memory check knows the peak: simulate (a fake-tensor trace) or estimate (the closed-form ledger)."""
    host_budget: str | None = None
    """--host-budget as typed; None: this machine's RAM as detected."""
    gpus: int | None = None
    """--gpus: the run's data-parallel GPUs; None: as the config says (advisor.yaml's ``advisor.gpus``), else 1."""


@dataclass
class PreflightResult:
    verdict: str
    findings: list[Finding]
    model: ModelSpec
    plan: Plan
    budget: Budget | None
    gpu: GpuSpec | None
    report: MemoryReport | None
    data: DataStats | None = None
    hours: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    gpu_assumed: bool = False
    """No GPU was named or detected: ``gpu`` is the catalog GPU the budget matches."""
    host_budget: Budget | None = None
    """The host RAM checked against (--host-budget, else detected)."""
    longest: dict[str, Any] | None = None
    """--seq-len max: the search (advisor.memory.longest.LongestFit.to_dict); ``plan`` is at its length."""

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "GO" else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "exit_code": self.exit_code,
            "model": self.model.summary(),
            "plan": self.plan.to_dict(), "plan_short": self.plan.short(),
            "gpu": self.gpu.to_dict() if self.gpu else None, "gpu_assumed": self.gpu_assumed,
            "budget": {"bytes": self.budget.bytes, "text": self.budget.text} if self.budget else None,
            "host_budget": {"bytes": self.host_budget.bytes, "text": self.host_budget.text}
            if self.host_budget else None,
            "memory": _memory_dict(self.report),
            "peak_phase": self.report.run_peak_phase if self.report is not None else None,
            "step_peak_phase": _rl.step_peak_phase(self.report) if self.report is not None and _rl.is_rl(self.plan)
            else None,
            "data": self.data.__dict__ if self.data else None, "hours": self.hours,
            "findings": [f.to_dict() for f in self.findings],
            **({"max_seq_len": self.longest["max_seq_len"], "seq_len_search": self.longest} if self.longest else {}),
        }


def _memory_dict(report: MemoryReport | None) -> dict[str, Any] | None:
    """The ledger with the run's phases (MemoryReport.to_dict)."""
    return None if report is None else report.to_dict()


def _load(path: str):
    from advisor.configs.read import read_config

    return read_config(path)


def run_preflight(inp: PreflightInput) -> PreflightResult:
    name_or_path, plan, extras = _load(inp.config)
    # the run's layout: its GPUs and how they split the model state, as the config says (the export's own)
    gpus, sharding = inp.gpus or int(extras.get("gpus") or 1), extras.get("sharding")
    target = resolve_target(name_or_path, gpu=inp.gpu, gpu_budget=inp.gpu_budget,
                            trust_remote_code=inp.trust_remote_code, budget_defaults_to_gpu=True,
                            host_budget=inp.host_budget, gpus=gpus)
    model, gpu, budget = target.model, target.gpu, target.budget
    sections = extras.get("sections", extras) if isinstance(extras, dict) else {}
    training = dict(sections.get("training") or {})
    model_section = dict(sections.get("model") or {})
    backend = inp.backend
    raw = extras["file"]  # the file as written: a flat TRL / axolotl / LLaMA-Factory file's keys
    if _rl.is_rl(plan) and not training:  # a flat file: its training keys are at the top
        training = raw

    findings: list[Finding] = []
    findings += _config.check_plan_rules(plan)
    findings += _config.check_targets(model, plan)
    findings += (_rl.check_learning_rate if _rl.is_rl(plan) else _config.check_learning_rate)(plan, training)
    findings += _config.check_use_cache(plan, model_section, model)
    findings += _config.check_pad_token(model)
    findings += _env.check_versions(plan)
    findings += _env.check_shell_allocator(extras)
    if plan.offload != "none":
        from advisor.memory.sharding import run_strategy

        sharding = run_strategy(plan, sharding)  # an offload's own engine, as tune and the exports decide it
    findings += _layout_findings(gpus, sharding)
    if plan.loss == "fused-linear":
        findings += _env.check_loss_kernel(plan, extras.get("format", ""), raw, gpu_here=target.detected is not None)
    findings += _env.check_gpu(plan, target.known_gpu, budget.bytes if budget else None)
    findings += _env.check_card(plan, target.known_gpu, model)

    seq_max = _longest.asked(inp.seq_len, inp.max_seq_len, budget, plan)
    stats = data_stats(inp.data, model.path) if inp.data else None
    seq = inp.max_seq_len or (inp.seq_len if not seq_max else None) or plan.seq_len

    def data_capped(seq: int) -> int:
        if stats is not None and stats.longest_tokens and not plan.packing and plan.task != "grpo":
            # padded batches: the longest one sets the peak; packed rows are always seq_len tokens
            return min(seq, max(1, stats.longest_tokens))
        return seq

    seq = data_capped(seq)
    evaluates = str(training.get("eval_strategy") or training.get("evaluation_strategy") or "no") != "no"
    mem_plan = plan.with_(seq_len=seq)
    if evaluates and not plan.eval_batch:
        # TrainingArguments.per_device_eval_batch_size defaults to 8
        mem_plan = mem_plan.with_(eval_batch=int(training.get("per_device_eval_batch_size") or 8))
    if plan.max_pixels and not plan.image_sizes and _vision.pixel_budget(model):
        # a config names no image (they are the data's): the largest one its pixel budget lets through is planned
        mem_plan = _vision.largest_sample(mem_plan, plan.max_pixels, model)
        if extras.get("sequence_counts_images"):  # the file's cap holds that image's tokens beside the text
            from advisor.core.vision_tokens import count_sample

            mem_plan = mem_plan.with_(seq_len=max(1, mem_plan.seq_len - count_sample(model, mem_plan).text_tokens))
    report = longest = None
    if not any(f.severity == "error" and f.area == "config" for f in findings):
        def measured(backend: str):
            """The run's report, at the longest length that fits for --seq-len max (the search and the plan)."""
            if not seq_max:
                return _memory(model, mem_plan, gpu, evaluates, backend, gpus, sharding), None, mem_plan
            from advisor.memory.longest import longest_plan

            at, fit = longest_plan(model, mem_plan, budget.bytes, inp.headroom,
                                   lambda p: _memory(model, p, gpu, evaluates, backend, gpus, sharding), backend)
            at = at.with_(seq_len=data_capped(at.seq_len))
            return _memory(model, at, gpu, evaluates, backend, gpus, sharding), fit, at

        gap = _simulation_gap(model, mem_plan) if backend == "simulate" else ""
        if gap:  # as the tuner does (advisor.search.tuner): the closed form answers what the simulation cannot trace
            backend = "estimate"
            findings.append(Finding("memory.answered-by", "info", "the closed form answered the memory check",
                                    f"{gap}; the closed form describes the plan", (), "memory"))
        try:
            report, fit, mem_plan = measured(backend)
        except AdvisorInputError:
            if backend == "estimate" or not _rl.is_rl(plan):
                raise
            backend = "estimate"  # a GRPO/DPO step the simulation does not run: the closed form answers it
            report, fit, mem_plan = measured(backend)
        if fit is not None:
            from advisor.memory.closed_form import CLOSED_FORM, SIMULATION

            findings += [_longest.finding(fit, budget, CLOSED_FORM if backend == "estimate" else SIMULATION)]
            longest = fit.to_dict()
            plan, seq = plan.with_(seq_len=fit.max_seq_len or fit.step), mem_plan.seq_len
        findings += memory_findings(report, budget, inp.headroom, seq, stats, mem_plan)
        findings += _vision.pixel_budget_findings(model, mem_plan, gpu, budget, inp.headroom)
        if _rl.is_rl(plan):
            findings += _rl.phase_finding(report, budget) + _rl.generation_findings(report, mem_plan, budget)
        if inp.probe:
            findings += _probe(model, mem_plan, target, inp.headroom)
        ckpt = _checkpoint_bytes(model, plan, report)
        findings += _env.check_host(report, target.host_budget, ckpt, training.get("output_dir", "outputs"),
                                    detected=target.host_here, gpus=gpus)
        hours, time_finding = _time(model, mem_plan, target, stats, training, inp.epochs)
        findings += time_finding
    else:
        hours = None
    order = {"error": 0, "warning": 1, "info": 2, "ok": 3}
    findings.sort(key=lambda f: order[f.severity])
    return PreflightResult(verdict(findings), findings, model, plan, budget, gpu, report, stats, hours,
                           extra={"backend": backend}, gpu_assumed=target.gpu_assumed, host_budget=target.host_budget,
                           longest=longest)


def _simulation_gap(model: ModelSpec, plan: Plan) -> str:
    """What of ``plan`` the simulation cannot trace, where the closed form describes the plan ('' otherwise: the
    simulation answers, or fails saying why)."""
    from advisor.memory.closed_form import closed_form_describes
    from advisor.runtime.simulate.vision import simulation_gap

    gap = simulation_gap(model, plan)
    return gap if gap and closed_form_describes(model, plan)[0] else ""


def _memory(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, evaluates: bool = True,
            backend: str = "simulate", gpus: int = 1, sharding: str | None = None) -> MemoryReport:
    """One GPU's step at the longest batch (its share of ``gpus`` under ``sharding``), with the phases of the whole
    run attached (advisor.memory.phases)."""
    from advisor.runtime.phases import run_report

    return run_report(model, plan, gpu, backend, evaluates=evaluates, gpus=gpus, sharding=sharding)


def _layout_findings(gpus: int, sharding: str | None) -> list[Finding]:
    """The run's layout the memory check assumes: one GPU's share of a sharded run, or a sharded config checked as
    one GPU (no GPU count in the file or on the command line)."""
    if gpus > 1:
        return [Finding("config.layout", "info", f"{gpus} GPUs, {sharding or 'ddp'}: the memory check is one GPU's "
                        "share, the host check the node's", "", (), "config", {"gpus": gpus, "sharding": sharding})]
    if sharding:
        return [Finding("config.layout", "warning", f"the config shards model state across GPUs ({sharding}) but "
                        "names no GPU count: checked as one GPU, which holds the whole model state",
                        "", ("pass --gpus N, the run's GPU count",), "config", {"gpus": 1, "sharding": sharding})]
    return []


def memory_findings(report: MemoryReport, budget: Budget | None, headroom: float, seq: int,
                    stats: DataStats | None, plan: Plan | None = None) -> list[Finding]:
    # the decision is on the run's peak: the highest of load, train, eval, generate and save
    peak, phase = report.run_peak_bytes, report.run_peak_phase
    if budget is None:
        return [Finding("memory.fit", "info", f"peak {format_bytes(peak)} ({report.source}, during {phase}); "
                        "no budget to check against", "", ("pass --gpu-budget or --gpu",), "memory")]
    top = sorted(((k, v) for k, v in report.device.items() if v >= 0.02 * budget.bytes), key=lambda kv: -kv[1])
    ledger = ", ".join(f"{LABELS.get(k, k).lower()} {budget.format(v)}" for k, v in top)
    where = f"at seq {seq:,}" + (" (the longest sequence in the data)" if stats else "")
    if plan is not None and plan.task == "grpo":  # the step that OOMs after N steps: every completion at its longest
        where = (f"with every completion at max_completion_length ({plan.max_prompt_length:,} + "
                 f"{plan.max_completion_length:,} tokens)")
    if phase != "train":
        where = f"during {phase} ({report.run_phases.phases[phase].what}); the training step {where} peaks at " \
                f"{budget.format(report.peak_bytes)}"
    data = {"peak_bytes": peak, "step_peak_bytes": report.peak_bytes, "run_peak_phase": phase,
            "budget_bytes": budget.bytes, "seq_len": seq}
    fit = fit_verdict(peak, budget.bytes, headroom)
    if fit == "over":
        over = ledger_over(report, budget.bytes, budget.format).replace("the card's", "the budget of")
        if plan is not None and _rl.is_rl(plan):
            fixes = _rl.phase_fixes(phase, plan) or _phase_fixes(phase)
        else:
            fixes = _memory_fixes(report) if phase == "train" else _phase_fixes(phase)
        return [Finding("memory.fit", "error",
                        f"does not fit: peak {budget.format(peak)} ({report.source}) > {budget} {where}",
                        f"ledger: {ledger}. {over}", fixes, "memory", data)]
    if fit == "tight":
        return [Finding("memory.fit", "warning",
                        f"tight: peak {budget.format(peak)} ({report.source}) leaves less than "
                        f"{headroom:.0%} of {budget} {where}", f"ledger: {ledger}", headroom_fixes(plan), "memory",
                        data)]
    left = budget.bytes - peak
    return [Finding("memory.fit", "ok", f"fits: peak {budget.format(peak)} ({report.source}) of {budget}, "
                    f"{budget.format(left)} left {where}", f"ledger: {ledger}", (), "memory", data)] \
        + error_band_findings(peak, budget, report.source, plan)


def headroom_fixes(plan: Plan | None) -> tuple[str, ...]:
    """What frees memory for this plan, the cheapest first, leaving out what it already does."""
    if plan is None:
        return ("lower the micro-batch or turn on gradient checkpointing for headroom",)
    fixes = []
    if plan.micro_batch > 1:
        fixes.append("lower the micro-batch (raise gradient_accumulation_steps to keep the batch)")
    if not plan.gradient_checkpointing:
        fixes.append("turn on gradient checkpointing")
    if plan.loss == "plain":
        fixes.append("use a chunked or fused cross-entropy loss (the whole vocabulary's logits)")
    if plan.peft and not plan.quantized:
        fixes.append("load the base in 4-bit (QLoRA nf4)")
    return (*fixes, "or run `advisor tune` for the fastest plan with more headroom")


def error_band_findings(peak: int, budget: Budget, source: str, plan: Plan | None = None) -> list[Finding]:
    """An info finding when the run would not fit at the backend's worst under-prediction on published runs
    (advisor/data/prediction_error.yaml): the margin is inside the prediction's measured error."""
    band = load_data_file("prediction_error.yaml").get(source)
    if not band:
        return []
    at_worst = peak / (1 + band["most_under"])
    if at_worst <= budget.bytes:
        return []
    return [Finding("memory.error-band", "info",
                    f"the margin is inside the prediction's measured error: {source} peaks were as much as "
                    f"{-band['most_under']:.1%} under published real-GPU runs, and at that error the peak would be "
                    f"{budget.format(at_worst)} of {budget}",
                    f"reports/memory_vs_published.md: {band['points']} published runs of the transformers stack, "
                    f"most under on {band['worst_under_point']}",
                    ("confirm on the GPU with --probe (a short real run held to the budget)",
                     *headroom_fixes(plan)), "memory",
                    {"most_under": band["most_under"], "peak_at_most_under_bytes": int(at_worst)})]


def _phase_fixes(phase: str) -> tuple[str, ...]:
    return {
        "eval": ("lower per_device_eval_batch_size (the logits of the whole vocabulary dominate evaluation)",
                 "set prediction_loss_only=True or eval_accumulation_steps so the Trainer does not keep eval logits "
                 "on the GPU"),
        "generate": ("lower the eval batch or max_new_tokens of generation-based evaluation",),
        "load": ("load with low_cpu_mem_usage and a quantization config (4-bit halves the load's 16-bit transient)",),
        "save": ("save with ZeRO-3 stage3_gather_16bit_weights_on_model_save off and consolidate offline "
                 "(zero_to_fp32.py)",),
    }.get(phase, ("or run `advisor tune` for the fastest plan that fits",))


def _memory_fixes(report: MemoryReport) -> tuple[str, ...]:
    d = report.device
    fixes = []
    if d.get("optimizer_states", 0) + d.get("gradients", 0) > d.get("activations", 0):
        fixes.append("train LoRA/QLoRA adapters instead of every weight (gradients and optimizer states shrink ~100x)")
        fixes.append("use an 8-bit optimizer (paged_adamw_8bit): states cost 1/4")
    if d.get("weights", 0) > 0.3 * report.peak_bytes:
        fixes.append("load the base in 4-bit (QLoRA nf4 + double quantization): weights cost ~1/4")
    if d.get("activations", 0) > 0.2 * report.peak_bytes:
        fixes.append("turn on gradient checkpointing or lower the micro-batch")
    if d.get("transient", 0) > 0.1 * report.peak_bytes:
        fixes.append("use a chunked cross-entropy loss (large vocabulary logits)")
    fixes.append("or run `advisor tune` for the fastest plan that fits")
    return tuple(fixes)


def _probe(model: ModelSpec, plan: Plan, target: Target, headroom: float) -> list[Finding]:
    """A real short run of the plan held to the budget (cuda on the GPU here, else the CPU): a run that fails
    (oom, timeout, crash, error) is an error finding, so the verdict is NO-GO naming the status."""
    from advisor.runtime.backends import BackendFailed, BackendOptions, get_backend

    device = "cuda" if target.detected is not None else "cpu"
    budget = target.budget
    options = BackendOptions(budget_bytes=budget.bytes if budget else None)
    held = f" held to {budget}" if budget else " (no budget to hold it to)"
    try:
        rep = get_backend(device).measure(model, plan, target.detected, options)
    except BackendFailed as e:
        double = getattr(e.result, "test_double", None)
        run = f"cuda test double ({double}; the step ran on the CPU)" if double else device
        return [Finding("memory.probe", "error", f"probe {e.status}: {e.message}",
                        f"a real {run} run of the plan{held} ended with status {e.status}",
                        ("lower the micro-batch or the sequence length, or run `advisor tune` for a plan that fits",),
                        "memory", {"status": e.status, "budget_bytes": options.budget_bytes, "test_double": double})]
    measured = rep.measured.to_dict() if rep.measured is not None else {}
    double = rep.measured.test_double if rep.measured is not None else None
    where = f"the cuda test double ({double}; the step ran on the CPU)" if double else f"the {device}"
    title = (f"probe ran: peak {format_bytes(rep.peak_bytes)} measured on {where}{held}, "
             f"{measured.get('tokens_per_s') or 0:,.0f} tokens/s")
    data = {"status": "ok", **rep.extra, **measured}
    if budget is not None and not fits(rep.peak_bytes, budget.bytes, headroom):
        return [Finding("memory.probe", "warning", title + f"; less than {headroom:.0%} of the budget left", "",
                        headroom_fixes(plan), "memory", data)]
    return [Finding("memory.probe", "ok", title, "", (), "memory", data)]


def _checkpoint_bytes(model: ModelSpec, plan: Plan, report: MemoryReport) -> int:
    """One checkpoint of the whole run: the trainable weights (the 16-bit model of a full fine-tune, the fp32 adapters)
    plus every rank's optimizer state, the fp32 master copy included (the Trainer saves both; DeepSpeed writes each
    rank's partition of masters and moments, ``*_optim_states.pt``: 12 B a parameter for AdamW besides the 16-bit
    model, 14 in all; advisor.memory.sharding.fp32_trainable_state). ``report`` is one GPU's: its sharded state times
    the GPUs that share it."""
    from advisor.memory.sharding import SHARDS_STATES

    d, host = report.device, report.host
    gpus, strategy = report.sharded or (1, "ddp")
    shards = gpus if strategy in SHARDS_STATES else 1
    state = sum(d.get(k, 0) + host.get(k, 0) for k in ("optimizer_states", "master_weights")) * shards
    if plan.peft:
        return int(max(d.get("adapter_weights", 0), report.extra.get("params_trainable", 0) * 4) + state)
    return int(model.params_total * 2 + state)


def _time(model, plan, target: Target, stats, training, epochs):
    from advisor.speed.throughput import predict_throughput

    epochs = epochs or training.get("num_train_epochs") or 1
    if stats is not None:
        tokens = stats.total_tokens * float(epochs)
        how = f"{stats.total_tokens:,} tokens{' (approx. chars/4)' if not stats.measured else ''} × {epochs} epochs"
    elif training.get("max_steps") and int(training["max_steps"]) > 0:
        tokens = int(training["max_steps"]) * plan.tokens_per_step
        how = f"{training['max_steps']} steps × {plan.tokens_per_step:,} tokens"
    else:
        return None, [Finding("time.estimate", "info", "no --data and no max_steps: training time not estimated", "",
                              ("pass --data FILE",), "time")]
    gpu = target.gpu
    if gpu is None:
        return None, [Finding("time.estimate", "info", "no GPU named or detected and no budget: training time not "
                              "estimated", how, ("pass --gpu NAME or --gpu-budget SIZE",), "time")]
    tps = predict_throughput(model, plan, gpu)
    hours = tokens / tps.tokens_per_s / 3600
    on = f"{gpu.name} (assumed from the budget)" if target.gpu_assumed else gpu.name
    return hours, [Finding("time.estimate", "info", f"about {hours:,.1f} h on a {on} "
                           f"({tps.tokens_per_s:,.0f} tokens/s predicted)", how, (), "time",
                           {"hours": hours, "tokens": tokens, "tokens_per_s": tps.tokens_per_s})]
