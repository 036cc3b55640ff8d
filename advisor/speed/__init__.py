"""speed layer: predicted step time and tokens/s (a step-time model made of terms), and its
per-GPU calibration from real probes. See advisor/speed/throughput.py."""

from advisor.speed.terms import step_terms
from advisor.speed.throughput import ThroughputPrediction, predict_throughput, term_labels

__all__ = ["ThroughputPrediction", "predict_throughput", "step_terms", "term_labels"]
