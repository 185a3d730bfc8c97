"""ceu-jax: causal evidence usage (CEU) audits and CER training for retrieval models."""
from ceu_jax import xla_cpu as _xla_cpu

_xla_cpu.apply()   # before JAX's backend starts (ceu_jax/xla_cpu.py)

__version__ = "0.1.0"
