"""Layers: attention, embeddings, losses, normalisation, recurrent cells, weight normalisation."""
