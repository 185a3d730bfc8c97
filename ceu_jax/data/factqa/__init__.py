"""Factual QA with controlled corruption (SPEC §3): SQuAD v1.1 dev + NQ knowledge conflicts.

  from ceu_jax.data import factqa
  cfg = factqa.FactQAConfig(num_passages=8, context_len=512, eta=0.1, delta=0.3)
  clean = factqa.generate_batch(cfg, seed=0, index=0, batch_size=32, split="eval")
  dminus = factqa.corrupt(cfg, clean, "entity_swap", jax.random.PRNGKey(0))

Data: `shipped/` (regenerate with `python scripts/prepare_factqa.py`). Reading goes
through a tfds array_record builder that is built into a cache dir on first use
($CEU_JAX_FACTQA_CACHE, default ~/.cache/ceu_jax/factqa). Needs `tokenizers`.
"""
from ceu_jax.data.factqa.config import FactQAConfig, ID_STRIDE, SOURCES, SPLITS
from ceu_jax.data.factqa.corrupt import CORRUPTIONS, corrupt
from ceu_jax.data.factqa.storage import FactQADataError
from ceu_jax.data.factqa.stream import (FactQAData, decode_row, example_batch,
                                        generate_batch, load)

__all__ = ["FactQAConfig", "FactQAData", "FactQADataError", "CORRUPTIONS", "ID_STRIDE",
           "SOURCES", "SPLITS", "corrupt", "decode_row", "example_batch", "generate_batch",
           "load"]
