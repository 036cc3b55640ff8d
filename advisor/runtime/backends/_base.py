"""The backend contract, in one place: what every way of measuring a plan's memory promises.

A backend turns (model, plan, GPU, options) into a ``MemoryReport`` with every ledger category:

- ``Backend``: the protocol (``name``, ``source``, ``accepts``, ``measure``);
- ``BackendOptions``: the typed, frozen options; an option that does not exist, or that this backend
  does not use, is an input error naming it (never silently dropped);
- ``BackendFailed``: the one failure type, carrying the status of the run (oom, timeout, crash,
  error) and, for a probe, its ``ProbeResult``. The tuner prunes on it; pre-flight turns it into NO-GO;
- ``Stage``: the stages a trial goes through when the tuner runs this backend (``stages``, declared on each
  backend class): the tuner runs what the backend declares, in order, and names no backend itself.

Every backend in ``advisor.runtime.backends`` passes the same contract test (tests/test_backend_contract.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from advisor.core.errors import AdvisorInputError

if TYPE_CHECKING:
    from advisor.core.catalog import GpuSpec, ModelSpec
    from advisor.core.plan import Plan
    from advisor.memory.ledger import MemoryReport

FAILURE_STATUSES = ("oom", "timeout", "crash", "error")
"""How a measuring run can fail (advisor.runtime.probe._result.STATUSES less "ok")."""


@dataclass(frozen=True)
class BackendOptions:
    """Options of one measurement. ``None`` everywhere: the backend's defaults."""

    budget_bytes: int | None = None
    """The memory budget enforced for real on the run (probes: RLIMIT_DATA on the CPU, the caching
    allocator's cap on a GPU): going over it is a real out-of-memory, status oom."""
    steps: int | None = None
    """Probes: measured optimizer steps (default 2)."""
    warmup: int | None = None
    """Probes: warm-up optimizer steps, run but not timed (default 1)."""
    timeout: float | None = None
    """Probes: seconds before the child process is killed (status timeout)."""
    data: str | None = None
    """Probes: a JSONL (field "text") or text file to train on; default synthetic token ids."""
    weights_dir: str | None = None
    """Probes: directory with real weights (then eval fidelity is measured)."""
    num_layers: int | None = None
    """Probes: build only this many decoder layers."""
    seed: int | None = None
    """Probes: seed of random weights and synthetic data."""
    layers: str | int | None = None
    """Simulate: decoder layers traced ("auto": two, extrapolated to all; an int: that many)."""

    @classmethod
    def of(cls, **options: Any) -> "BackendOptions":
        """Options from keywords; an unknown name is an input error naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise AdvisorInputError(f"backend option {unknown[0]}",
                                    f"no such option (options: {', '.join(sorted(known))})", options[unknown[0]])
        return cls(**options)

    def given(self) -> dict[str, Any]:
        """The options set (not None)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


STAGES = ("estimate", "simulate", "probe")
"""The kinds of stage a trial can go through, cheapest first."""


@dataclass(frozen=True)
class Stage:
    """One stage of a trial under a backend: which backend measures it, and what its peak decides."""

    name: str
    """estimate, simulate or probe (``STAGES``)."""
    backend: str
    """The backend that measures the stage (advisor.runtime.backends.get_backend)."""
    decides: bool
    """Its peak decides feasibility (peak <= budget x (1 - headroom), advisor.core.fit); otherwise it only screens
    out a plan over the budget by more than the tuner's prescreen margin, and a later stage decides."""
    finalists_only: bool = False
    """Only a plan that could become the answer reaches it; for any other the stage before decides."""
    on_target_gpu: bool = False
    """It runs on the GPU the plan is for: the budget is enforced for real and its speed calibrates the step-time
    model."""

    def __post_init__(self) -> None:
        if self.name not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)} (got {self.name!r})")


ESTIMATE_SCREEN = Stage("estimate", "estimate", decides=False)
"""The closed form first, screening out what is far over the budget, before a stage that decides."""


class BackendFailed(Exception):
    """The plan did not run under a measuring backend: status oom, timeout, crash or error."""

    def __init__(self, backend: str, status: str, message: str, result: Any = None):
        if status not in FAILURE_STATUSES:
            raise ValueError(f"status must be one of {', '.join(FAILURE_STATUSES)} (got {status!r})")
        self.backend, self.status, self.message, self.result = backend, status, message, result
        super().__init__(f"the {backend} probe ended with status {status}: {message}")


@runtime_checkable
class Backend(Protocol):
    """One way to measure a plan's memory."""

    name: str
    """estimate, simulate, cpu or cuda."""
    source: str
    """What its numbers are: estimated, simulated or measured."""
    accepts: frozenset[str]
    """The BackendOptions this backend uses; any other one given is an input error."""
    stages: tuple[Stage, ...]
    """What a tuner trial runs under this backend, in order (the last one is this backend's own)."""

    def measure(self, model: "ModelSpec", plan: "Plan", gpu: "GpuSpec | None" = None,
                options: BackendOptions | None = None) -> "MemoryReport":
        """The ledger of one training step of ``plan`` on ``model`` (for ``gpu``'s overheads).

        Raises AdvisorInputError for bad input, BackendFailed when the run itself fails."""
        ...


class BaseBackend:
    """Shared by the backends: checks the options against ``accepts``; calling it is ``measure``."""

    name: ClassVar[str] = ""
    source: ClassVar[str] = ""
    accepts: ClassVar[frozenset[str]] = frozenset()
    stages: ClassVar[tuple[Stage, ...]] = ()

    def check(self, options: BackendOptions | None) -> BackendOptions:
        options = options or BackendOptions()
        extra = sorted(set(options.given()) - self.accepts)
        if extra:
            uses = ", ".join(sorted(self.accepts)) or "none"
            raise AdvisorInputError(f"backend option {extra[0]}", f"the {self.name} backend does not use it "
                                    f"(it uses: {uses})", options.given()[extra[0]])
        return options

    def measure(self, model, plan, gpu=None, options: BackendOptions | None = None):
        raise NotImplementedError

    def __call__(self, model, plan, gpu=None, **options: Any):
        """``backend(model, plan, gpu, steps=2, ...)``: measure with keyword options."""
        return self.measure(model, plan, gpu, BackendOptions.of(**options))

    def __repr__(self) -> str:
        return f"<{self.name} backend ({self.source})>"


__all__ = ["Backend", "BackendFailed", "BackendOptions", "BaseBackend", "ESTIMATE_SCREEN", "FAILURE_STATUSES", "STAGES",
           "Stage"]
