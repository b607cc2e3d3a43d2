"""Trained drafters: the EAGLE network, its checkpoints, its per-call cache and draft trees, its recipe."""
