"""Tensors: allocation, dtypes, indexing, scatter, reductions, transfers, and the small
operators every training step meets."""
