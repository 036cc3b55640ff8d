"""The probe's child process: build the plan's training setup, run it, report every step.

Run as ``python -X faulthandler -m advisor.runtime.probe._worker REQUEST.json EVENTS.jsonl``. Each
event is one JSON line, flushed at once, so that the parent sees progress (and memory per
step, to stop a run going over budget early) and keeps what was measured if the child dies.

Measurement protocol (after nanoGPT's bench.py): ``warmup`` optimizer steps run untimed, then
each measured step is timed between two device synchronizations; the peak memory of each step
is read after it (the allocator's peak counter, or the live-bytes tracker, reset before it).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from advisor.runtime.probe._classify import essence, status_of_exception
from advisor.runtime.probe._request import ProbeRequest


class Events:
    def __init__(self, path: str) -> None:
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the child's life

    def emit(self, ev: str, **fields: Any) -> None:
        self._f.write(json.dumps({"ev": ev, "t": time.time(), **fields}) + "\n")
        self._f.flush()


def versions() -> dict[str, str | None]:
    """Library versions without importing the libraries that are not loaded yet (deepspeed is slow)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft", "bitsandbytes", "deepspeed", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    import torch

    out["cuda"] = torch.version.cuda
    out["driver"] = None
    try:
        from advisor.runtime.cuda_boundary import nvml

        lib = nvml()
        lib.nvmlInit()
        drv = lib.nvmlSystemGetDriverVersion()
        out["driver"] = drv.decode() if isinstance(drv, bytes) else drv
    except Exception:  # noqa: BLE001 - no NVML, no driver
        pass
    out["python"] = sys.version.split()[0]
    return out


def _preimport(model_type: str) -> None:
    """Import what building the model imports lazily, so that the CPU limit's baseline includes it."""
    import peft  # noqa: F401
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name:
        getattr(transformers, name, None)
    # the optimizer is built through Trainer (advisor.runtime.build.build_optimizer); importing it
    # pulls datasets and pandas when they are installed (trl brings them), tens of MB
    transformers.Trainer  # noqa: B018
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        pass


def _sync(device: str) -> None:
    if device == "cuda":
        from advisor.runtime.cuda_boundary import cuda

        cuda().synchronize()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def set_learning_rate(optimizer: Any, plan: Any, lr: float) -> str:
    """Every parameter group of ``optimizer`` at the constant rate ``lr`` (no schedule); the note saying so.

    LOMO and AdaLomo take their rate as an argument of ``fused_backward`` (advisor.runtime.build), not from
    their groups: for them the note says the rate stayed Trainer's default."""
    if plan.optimizer in ("lomo", "adalomo"):
        return (f"learning rate {lr:g} asked for, but {plan.optimizer} steps inside backward at the rate "
                "build.TRAINER_DEFAULT_LEARNING_RATE passes: not applied")
    groups = list(getattr(optimizer, "param_groups", None) or [])
    for per_param in (getattr(optimizer, "optimizer_dict", None) or {}).values():  # layer-wise GaLore
        groups += list(per_param.param_groups)
    for group in groups:
        group["lr"] = lr
    return f"learning rate {lr:g}, constant, on {len(groups)} parameter groups"


def run(req: ProbeRequest, events: Events) -> dict[str, Any]:
    import statistics

    import torch

    from advisor.core.catalog import ModelSpec
    from advisor.core.plan import Plan
    from advisor.runtime import cuda_boundary
    from advisor.runtime.probe import _data, _fidelity, _limits, _memory
    from advisor.runtime.probe._faults import inject

    spec = ModelSpec(**req.spec)
    plan = Plan.from_dict(req.plan)
    device = req.device
    notes: list[str] = []
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        notes.append(f"PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']}")
    out: dict[str, Any] = {"versions": versions(), "notes": notes, "gpu_name": None}
    cuda_mem = None
    if device == "cuda":
        cuda = cuda_boundary.cuda()  # torch.cuda, or the CUDA test double (advisor.runtime.cuda_double)
        if not cuda.is_available():
            raise RuntimeError("device cuda asked for, but torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        cuda_mem = _memory.CudaMemory(0)  # before CUDA creates its context: NVML's baseline is the GPU without us
        out["gpu_name"] = cuda.get_device_name(0)
        cuda_mem.start_sampler()
        double = cuda_boundary.double()
        if double is not None:
            notes.append(double.note)
    on = cuda_boundary.tensor_device(device)  # where the tensors live: the CPU under the CUDA test double
    torch.manual_seed(req.seed)

    events.emit("phase", phase="import")
    from advisor.runtime.build import build_training_setup

    _preimport(spec.model_type)
    total_steps = req.warmup + req.steps
    batches, out["tokenizer"] = _data.training_batches(
        data=req.data, model_dir=req.weights_dir or spec.path, vocab_size=spec.vocab_size,
        micro_batch=plan.micro_batch, seq_len=plan.seq_len, grad_accum=plan.grad_accum, steps=total_steps,
        seed=req.seed)

    ref = eval_ids = None
    window = req.eval_window or min(plan.seq_len, 512)
    if req.weights_dir and req.eval_texts:
        eval_ids = _data.eval_ids(list(req.eval_texts), req.weights_dir, spec.vocab_size, req.max_eval_tokens)
        if req.fidelity:
            events.emit("phase", phase="reference")
            ref = _fidelity.reference_logprobs(req.weights_dir, eval_ids, window, device)
            if cuda_mem is not None:
                cuda_mem.nvml_peak = 0  # the reference model is gone (empty_cache): it is not the plan's memory
        else:
            notes.append("eval fidelity not measured (asked): eval loss only, no 16-bit reference model loaded")
    elif not req.weights_dir:
        notes.append("random weights: eval fidelity and eval loss not measured")

    if req.memory_limit_bytes:
        events.emit("phase", phase="limit")
        limits = (_limits.limit_cuda(req.memory_limit_bytes, cuda_mem, on) if device == "cuda"
                  else _limits.limit_cpu(req.memory_limit_bytes))
        out["limits"] = limits

    tracker, cpu_method = _memory.make_tracker() if device == "cpu" else (None, "")

    def reset_peak() -> None:
        if tracker is not None:
            tracker.reset_peak()
        else:
            cuda_mem.reset_peak()

    def peaks() -> dict[str, Any]:
        if tracker is not None:
            return {"peak": tracker.peak, "reserved": None, "nvml": None, "phase": tracker.peak_phase}
        _sync(device)
        cuda_mem.sample()
        return {"peak": cuda_mem.peak_allocated(), "reserved": cuda_mem.peak_reserved(),
                "nvml": cuda_mem.nvml_peak or None}  # the sampler's running maximum

    if tracker is not None:
        tracker.__enter__()
    try:
        events.emit("phase", phase="build")
        setup = build_training_setup(spec, plan, device=on, target_device=device, num_layers=req.num_layers,
                                     quant_impl=req.quant_impl, weights_dir=req.weights_dir, seed=req.seed)
        stepper: Any = setup
        notes.extend(getattr(setup, "notes", []) or [])
        if tracker is not None:
            setup.phase_hook = tracker.set_phase  # the peak's phase: forward, backward, optimizer, zero_grad
        if plan.offload != "none":
            events.emit("phase", phase="deepspeed")
            from advisor.runtime.probe._deepspeed import DeepSpeedStepper

            stepper = DeepSpeedStepper(setup, plan, on)
            notes.append(f"DeepSpeed {plan.offload}: optimizer states in host memory")
        if req.learning_rate is not None:
            notes.append(set_learning_rate(getattr(stepper, "optimizer", None), plan, req.learning_rate))
        if tracker is not None:
            tracker.track_all(_memory.module_tensors(setup.model, setup.optimizer))
        load = peaks()
        out["load_peak_bytes"] = load["peak"]
        out["load_reserved_bytes"] = load["reserved"]
        events.emit("loaded", **load)

        if eval_ids is not None:
            events.emit("phase", phase="fidelity" if ref is not None else "eval")
            ev = _fidelity.evaluate(setup.model, eval_ids, window, device, plan, ref)
            out.update(eval_loss_base=ev["eval_loss"], fidelity_tokens=ev["tokens"])
            if ref is not None:
                out["fidelity_kl"] = ev["kl"]

        step_peaks, times, losses, grads, peak_phase = [], [], [], 0, ""
        nvml_peak = reserved_peak = 0
        events.emit("phase", phase="train")
        for i in range(total_steps):
            reset_peak()
            _sync(device)
            t0 = time.perf_counter()
            micro = [float(stepper.micro_step(ids, ids)) for ids in batches[i]]
            if stepper is setup:
                grads = _memory.grads_bytes(setup.model)
            stepper.optimizer_step()
            _sync(device)
            dt = time.perf_counter() - t0
            p = peaks()
            loss = sum(micro) / len(micro)
            if not step_peaks or p["peak"] > max(step_peaks):
                peak_phase = p.get("phase") or ""
            step_peaks.append(p["peak"])
            losses.append(loss)
            if i >= req.warmup:
                times.append(dt)
            reserved_peak = max(reserved_peak, p["reserved"] or 0)
            nvml_peak = max(nvml_peak, p["nvml"] or 0)
            events.emit("step", i=i, time_s=dt, loss=loss, warmup=i < req.warmup, **p)
            if i == 0:
                inject(req.fault, events.emit)
        out["breakdown"] = _memory.persistent_breakdown(setup.model, getattr(stepper, "optimizer", None),
                                                        peft=plan.peft, grads_bytes=grads)
        if stepper is not setup:
            out["breakdown"].pop("gradients", None)
            notes.append("gradients and optimizer states live inside DeepSpeed's partitions: not split out")
        if eval_ids is not None:
            out["eval_loss_after"] = _fidelity.evaluate(setup.model, eval_ids, window, device, plan)["eval_loss"]
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
        if cuda_mem is not None:
            cuda_mem.stop()

    out.update(
        steps_done=total_steps, step_peaks_bytes=step_peaks, step_times_s=times, losses=losses,
        final_loss=losses[-1], peak_allocated_bytes=max(step_peaks), peak_phase=peak_phase,
        step_time_median_s=statistics.median(times), step_time_p90_s=percentile(times, 90),
        tokens_per_s=plan.tokens_per_step / statistics.median(times),
        memory_method=cpu_method if tracker is not None else cuda_mem.method,
        tokenizer=out["tokenizer"],
    )
    if cuda_mem is not None:
        out.update(peak_reserved_bytes=reserved_peak, nvml_peak_bytes=max(nvml_peak, cuda_mem.nvml_peak) or None,
                   alloc_retries=cuda_mem.alloc_retries())
        if cuda_mem.nvml_method:
            notes.append(cuda_mem.nvml_method)
    return out


def main(argv: list[str]) -> int:
    request_path, events_path = argv[1], argv[2]
    events = Events(events_path)
    events.emit("started", pid=os.getpid())
    req = None
    try:
        req = ProbeRequest.read(Path(request_path))
        result = run(req, events)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a reported status
        text = f"{type(e).__name__}: {e}"
        status = status_of_exception(type(e).__name__, str(e), limited=bool(req and req.memory_limit_bytes))
        events.emit("failed", status=status, message=essence(text), traceback=traceback.format_exc()[-4000:])
        return 1
    events.emit("result", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
