"""The simulate backend's parts: quantized-layer stand-ins, the live-bytes tracker, the runner and
layer extrapolation. Nothing heavy is imported here; each module imports torch when used."""
