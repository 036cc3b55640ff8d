"""Serving plans (``advisor tune --task inference``): space, search, selection, simulation, probe, exports.

Nothing heavy is imported here; torch and transformers are imported by the functions that need them.
"""

from advisor.serve.priors import load_priors, quality_prior

__all__ = ["load_priors", "quality_prior"]
