"""Per-example measurements of trained ATR-insert models for the bound plots.

Everything here runs a trained model; the statistics live in the other theory
modules. Evaluation sets come from the generator itself
(`data.atr.generate_batch` with test-time η and δ), corruptions from
`data.corruptions`, CEU rows from the one `ceu_jax.auditor.Auditor`.

Shape legend: B batch, N context, A answer tokens, V vocabulary.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from ceu_jax import auditor as auditor_lib
from ceu_jax import engine
from ceu_jax.data import atr, corruptions, evalsets
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import RetrievalBatch
from ceu_jax.theory import identifiability
from ceu_jax.theory.upper_bound import logit_margin


@dataclasses.dataclass(frozen=True)
class TrainedModel(auditor_lib.OfAuditedModel):
  """A trained model with what the measurements need."""
  name: str
  audited: auditor_lib.AuditedModel     # model, read port f, data (ceu_jax.auditor)
  variables: dict
  settings: auditor_lib.AuditSettings   # the training config's audit settings


def load_trained(name: str, config, workdir: str) -> TrainedModel:
  """The newest checkpoint of the training run `config` in `workdir`."""
  from ceu_jax.train import load_trained_params
  return TrainedModel(name, auditor_lib.audited_model(config),
                      load_trained_params(config, workdir),
                      auditor_lib.AuditSettings.of_config(config))


def eval_set(data_cfg: ATRConfig, seed: int, num: int, *, split: str = "test",
             eta: float = 0.0, delta: float | None = None) -> RetrievalBatch:
  """`num` examples of the generator at test-time η (and δ, default the config's)."""
  cfg = dataclasses.replace(data_cfg, eta=float(eta),
                            delta=data_cfg.delta if delta is None else float(delta))
  return atr.generate_batch(cfg, seed, 0, num, split)


def _slices(num: int, batch_size: int):
  return [(s, min(s + batch_size, num)) for s in range(0, num, batch_size)]


def _take(batch: RetrievalBatch, start: int, stop: int) -> RetrievalBatch:
  return jax.tree_util.tree_map(lambda x: x[start:stop], batch)


@functools.partial(jax.jit, static_argnums=0)
def model_logits(model, variables, inputs) -> jax.Array:
  return model.apply(variables, *inputs)


def logits(tm: TrainedModel, batch: RetrievalBatch) -> np.ndarray:
  """Model logits [B, A, V] on a batch."""
  return np.asarray(model_logits(tm.model, tm.variables, batch.model_inputs()), np.float64)


def measure_set(tm: TrainedModel, clean: RetrievalBatch, corruption: str,
                key: jax.Array, *, batch_size: int = 128, probe_chunk: str | int = "auto",
                eps: float = 1e-3) -> dict[str, np.ndarray]:
  """Per-example rows ([B] arrays) of one evaluation set under one corruption.

  Columns: correct, has_evidence, ceu_ev (NaN where degenerate), degenerate,
  L_plus, L_minus, margin_plus / margin_minus (gold-vs-best-alternative logit
  margin on D+ / D−, nats) and swap_margin = margin_plus − margin_minus.
  """
  corrupt = corruptions.corrupt(tm.data_cfg, clean, corruption, key)
  data = evalsets.FixedEvalSet(clean, {corruption: corrupt}, identity={})
  settings = dataclasses.replace(tm.settings, batch_size=batch_size, probe_chunk=probe_chunk,
                                 eps=eps)
  out = auditor_lib.Auditor(tm.audited, settings).rows(tm.variables, data)[corruption]
  gold = np.asarray(clean.answer)
  margins = {"margin_plus": [], "margin_minus": []}
  for a, b in _slices(clean.batch_size, batch_size):
    margins["margin_plus"].append(logit_margin(logits(tm, _take(clean, a, b)), gold[a:b]))
    margins["margin_minus"].append(logit_margin(logits(tm, _take(corrupt, a, b)), gold[a:b]))
  out.update({k: np.concatenate(v) for k, v in margins.items()})
  out["swap_margin"] = out["margin_plus"] - out["margin_minus"]
  keep = ("correct", "has_evidence", "ceu_ev", "degenerate", "L_plus", "L_minus",
          "margin_plus", "margin_minus", "swap_margin")
  return {k: out[k] for k in keep}


# --------------------------------------------------------------- T1


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _t1_logits(model, site: engine.Site, approximate: bool, variables, clean, corrupt, span):
  """(z+, z−, z_int) [B, A, V]: z_int patches Π_S h_f(D+) into the run on D−."""
  def logits_fn(v, inputs):
    return model.apply(v, *inputs)
  site = engine.Site.parse(site)
  z_plus, rec = engine.record(logits_fn, variables, clean, site, span_mask=span,
                              allow_approximate=approximate)
  z_minus = logits_fn(variables, corrupt)
  z_int = engine.patch(logits_fn, variables, corrupt, site, rec[site],
                       span_mask=span, allow_approximate=approximate)
  return z_plus, z_minus, z_int


def t1_trained(tm: TrainedModel, clean: RetrievalBatch, corruption: str,
               key: jax.Array, batch_size: int = 128
               ) -> identifiability.T1Result:
  """T1 on a trained model: evidence-span restoration in loglik vs logit space.

  The intervened run is the engine's span patch with S = E(D+) at the read
  port; the loglik_fn handed to the engine returns the full logit vectors, so
  both restoration fractions come from the same three runs.
  """
  corrupt = corruptions.corrupt(tm.data_cfg, clean, corruption, key)
  zs = []
  for a, b in _slices(clean.batch_size, batch_size):
    c, d = _take(clean, a, b), _take(corrupt, a, b)
    out = _t1_logits(tm.model, tm.site, tm.approximate, tm.variables,
                     c.model_inputs(), d.model_inputs(), c.evidence_mask)
    zs.append([np.asarray(z, np.float64) for z in out])
  z_plus, z_minus, z_int = (np.concatenate([z[i] for z in zs]) for i in range(3))
  return identifiability.t1_from_logits(z_plus, z_minus, z_int,
                                        np.asarray(clean.answer))
