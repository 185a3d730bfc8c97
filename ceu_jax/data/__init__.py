"""Data generators, corruptions and evaluation sets. Knows nothing of models."""
