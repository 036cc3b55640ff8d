"""The probe: a short real training run of a plan in an isolated child process, measured.

``run_probe(model_spec, plan, device=..., steps=..., ...) -> ProbeResult`` runs the plan's real
training setup (advisor.runtime.build) for a few optimizer steps in a fresh Python child and reports its
status (ok, oom, timeout, crash, error), peak memory, step times, tokens per second, losses and,
with real weights, eval fidelity. Nothing heavy is imported until a probe runs.
"""

from advisor.runtime.probe._data import data_profile, read_documents
from advisor.runtime.probe._request import FAULTS
from advisor.runtime.probe._result import STATUSES, ProbeResult
from advisor.runtime.probe._runner import DEVICES, run_probe

__all__ = ["DEVICES", "FAULTS", "STATUSES", "ProbeResult", "data_profile", "read_documents", "run_probe"]
