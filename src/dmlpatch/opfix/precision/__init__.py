"""Precision: float16 through the CPU fallback, float64 draws without float64."""
