"""ceu-jax: causal evidence usage (CEU) audits and CER training for retrieval models."""
__version__ = "0.1.0"
