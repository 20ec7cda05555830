"""Measuring a model rather than running it: per-sublayer gradient diagnostics, FLOP counts."""
