"""Optimizer steps: the foreach operators and the fused Adam/AdamW."""
