"""`advisor preflight`: go / no-go for a training config before a long run, with reasons and fixes.

Checks are small functions grouped by area (environment, config, memory, time), each returning
Findings; ``run_preflight`` gathers them and gives the verdict.
"""

from advisor.diagnosis.preflight._run import PreflightInput, PreflightResult, run_preflight

__all__ = ["PreflightInput", "PreflightResult", "run_preflight"]
