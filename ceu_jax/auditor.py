"""One audited model and one Auditor: the single way from a config to CEU rows.

    bundle  = audited_model(config)                    # model, site f, loglik, task
    data    = eval_set(config)                         # THE fixed eval set of config.eval
    auditor = Auditor(bundle, AuditSettings.of_config(config))
    rows    = auditor.rows(variables, data)            # {corruption: {column: [n]}}
    summary = auditor.summarize(rows)                  # {corruption: summarize_audit}

Training-time evaluation (`ceu_jax.train.evaluation`), `experiments.audit`
(`ceu_jax.audit_job`), every grid cell (`ceu_jax.grid.cell`), the bound
measurements (`ceu_jax.theory.measure`) and `benchmarks/audit_bench.py` build
their model, read port and rows here, so the same checkpoint on the same eval
set gives the same rows wherever they are computed (tested).

Rows (one per example; SPEC §1, §5): example_id, correct (teacher-forced EM on
D+), has_evidence, dis_found, L_plus, L_minus, L_int_<p>, ceu_<p> (NaN where
degenerate), delta_L, delta_<p> for the probes p of
`ceu_jax.retrieval_adapter.PROBES` (ev, dis, control), degenerate.
Probe spans are drawn with one key per (probe seed, corruption, example): a
row does not depend on the batch it was computed in.

On a device mesh (`Auditor(..., batch_sharding=NamedSharding(mesh, P('data')))`)
each batch is split over the data axis, the variables replicated (or left in
their model-parallel layout), and the rows gathered on every process
(`ceu_jax.engine.placement`); they equal the one-device rows (tested).

Shape legend: B batch, N context tokens, K probes.
"""
from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np

import architectures
from ceu_jax import audit_config, engine, metrics, multihost, progress
from ceu_jax.engine import placement
from ceu_jax import retrieval_adapter as adapter
from ceu_jax.data import evalsets, tasks
from ceu_jax.data.types import RetrievalBatch
from ceu_jax.likelihood import answer_confidence, answer_correct

PROBE_SALT = 0x0A0D17   # probe keys: fold_in(fold_in(PRNGKey(seed), SALT), crc32(corruption))
Rows = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class AuditedModel:
  """What is audited: a retrieval model, its read port f and its task."""
  model: nn.Module          # conventions §2: apply(v, query, context, passage_ids, answer)
  site: engine.Site         # THE read port f (`model.read_port`)
  approximate: bool         # Π_S at f is approximate (memory_port): flagged in results
  task: str                 # data.task
  data_cfg: Any             # ATRConfig | FactQAConfig of the data the model reads

  @property
  def loglik_fn(self) -> adapter.LoglikFn:
    return adapter.loglik_fn_for(self.model)

  @property
  def dummy_inputs(self) -> tuple:
    """(query, context, passage_ids, answer) of batch 1, for init / eval_shape."""
    d = self.data_cfg
    return (np.ones((1, d.query_len), np.int32), np.ones((1, d.context_len), np.int32),
            np.zeros((1, d.context_len), np.int32), np.ones((1, d.answer_len), np.int32))

  @property
  def task_spec(self) -> tasks.TaskSpec:
    return tasks.get(self.task)


class OfAuditedModel:
  """Mixin for records that hold an `AuditedModel` as `audited`: its model, site,
  approximate flag, data config and loglik function read through."""
  audited: AuditedModel

  @property
  def model(self) -> nn.Module:
    return self.audited.model

  @property
  def site(self) -> engine.Site:
    return self.audited.site

  @property
  def approximate(self) -> bool:
    return self.audited.approximate

  @property
  def data_cfg(self) -> Any:
    return self.audited.data_cfg

  @property
  def loglik_fn(self) -> adapter.LoglikFn:
    return self.audited.loglik_fn


def audited_model(config: Any, *, data_cfg: Any = None, model: nn.Module | None = None,
                  site: engine.Site | None = None) -> AuditedModel:
  """The audited model of a (validated) training config.

  `data_cfg`: the data it reads (a grid's shifted test condition; default
  config.data) — the model is built at those sizes (its position tables are
  parameter-free). `model`/`site`: a toy model and its port instead of the
  configured architecture (tests)."""
  task = tasks.of_config(config.data).name
  data_cfg = tasks.data_config(config.data) if data_cfg is None else data_cfg
  if model is None:
    model = architectures.build_model(
        config.model, vocab_size=data_cfg.vocab.size, context_len=data_cfg.context_len,
        num_passages=data_cfg.num_passages, query_len=data_cfg.query_len,
        answer_len=data_cfg.answer_len)
    site = architectures.read_port_site(config.model)
    approximate = architectures.span_decomposition(config.model.family) != "exact"
  else:
    if not isinstance(site, engine.Site):
      raise TypeError(f"audited_model: a custom model needs its read port as an "
                      f"engine.Site, got {site!r}")
    approximate = False
  return AuditedModel(model=model, site=site, approximate=approximate,
                      task=task, data_cfg=data_cfg)


@dataclasses.dataclass(frozen=True)
class AuditSettings:
  """How an audit runs: batching, probe chunks, ε, probe keys, bootstrap (from the
  config's eval section: `ceu_jax.audit_config.EvalSection`)."""
  batch_size: int = 128             # examples per compiled call
  probe_chunk: str | int = "auto"   # probes per vmapped chunk: 'auto' (the engine's
                                    # measured rule, engine.chunking) or an int >= 1;
                                    # the rows do not depend on it (tested)
  eps: float = 1e-3                 # ε of the stabilised CEU (degenerate below)
  probe_seed: int = 0               # seed of the distractor / control span draws
  num_resamples: int = 1000         # bootstrap resamples of the summary CIs

  def __post_init__(self):
    object.__setattr__(self, "probe_chunk", audit_config.probe_chunk(self.probe_chunk))

  @classmethod
  def of_config(cls, config: Any) -> "AuditSettings":
    e = config.eval
    return cls(batch_size=int(e.batch_size), probe_chunk=e.probe_chunk,
               eps=float(e.eps), probe_seed=int(e.seed),
               num_resamples=max(int(e.num_resamples), 1))


def eval_set(config: Any, *, data_cfg: Any = None,
             data_dir: Optional[str] = None) -> evalsets.FixedEvalSet:
  """THE fixed evaluation set of `config.eval` (seed, num_examples, corruptions) on
  `data_cfg` (default config.data; a grid condition shifts one knob)."""
  e = config.eval
  return evalsets.fixed_eval_set(
      tasks.of_config(config.data).name,
      tasks.data_config(config.data) if data_cfg is None else data_cfg,
      seed=int(e.seed), num_examples=int(e.num_examples),
      corruptions=tuple(e.corruptions), data_dir=data_dir)


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _probes_and_correct(model, variables, clean: RetrievalBatch, corrupt: RetrievalBatch,
                        key: jax.Array, k: int, host_sharding=None):
  """(probes [K, B, N], dis_found [B], correct [B], confidence [B]: the probability of
  the teacher-forced argmax answer); the last three laid out by `host_sharding`
  (replicated on a mesh: every process reads them)."""
  probes, dis_found = adapter.probe_set(clean, corrupt, key, k)
  logits = model.apply(variables, *clean.model_inputs())
  correct = answer_correct(logits, clean.answer)
  confidence = answer_confidence(logits, clean.answer)
  if host_sharding is not None:
    dis_found, correct, confidence = jax.lax.with_sharding_constraint(
        (dis_found, correct, confidence), host_sharding)
  return probes, dis_found, correct, confidence


# Several processes start these programs together (ceu_jax.multihost).
_probes_and_correct_synced = multihost.Synced(_probes_and_correct, "auditor.probes")
_audit_synced = multihost.Synced(engine.audit, "engine.audit", lower=engine.audit_lowered)


def concat_rows(parts: Sequence[Rows]) -> Rows:
  """Batches' rows joined, in order; a column only where every batch has it (a resumed
  audit's batches from an earlier version of the code may lack a newer column, e.g.
  `confidence`: the summary then leaves that section out rather than mixing)."""
  keys = [k for k in parts[0] if all(k in p for p in parts[1:])]
  return {k: np.concatenate([p[k] for p in parts]) for k in keys}


class Auditor:
  """Scores an `AuditedModel` on fixed eval sets: CEU rows per corruption."""

  def __init__(self, bundle: AuditedModel, settings: AuditSettings = AuditSettings(), *,
               batch_sharding: jax.sharding.NamedSharding | None = None):
    """`batch_sharding`: split each eval batch over a mesh, e.g.
    NamedSharding(mesh, P('data')) (`ceu_jax.engine.placement`); None = one device."""
    self.bundle = bundle
    self.settings = settings
    self.batch_sharding = (None if batch_sharding is None
                           else placement.check(batch_sharding))

  def probe_key(self, corruption: str) -> jax.Array:
    base = jax.random.fold_in(jax.random.PRNGKey(self.settings.probe_seed), PROBE_SALT)
    return jax.random.fold_in(base, np.uint32(zlib.crc32(corruption.encode())))

  def batch_rows(self, variables: Any, clean: RetrievalBatch, corrupt: RetrievalBatch,
                 corruption: str) -> Rows:
    """Rows of one batch of D+ and its D− under `corruption`."""
    b, s, bs = self.bundle, self.settings, self.batch_sharding
    host = clean
    if bs is not None:
      clean = placement.place_batch(clean, bs, "clean")
      corrupt = placement.place_batch(corrupt, bs, "corrupt")
      variables = placement.place_variables(variables, bs)
    probes, dis_found, correct, confidence = _probes_and_correct_synced(
        b.model, variables, clean, corrupt, self.probe_key(corruption), len(adapter.PROBES),
        None if bs is None else placement.replicated(bs))
    res = _audit_synced(b.loglik_fn, variables, clean=adapter.ModelInputs.of(clean),
                       corrupt=adapter.ModelInputs.of(corrupt), site=b.site, probes=probes,
                       chunk_size=s.probe_chunk, eps=s.eps, allow_approximate=b.approximate,
                       batch_sharding=bs)
    rows = dict(example_id=host.example_id, correct=correct, confidence=confidence,
                has_evidence=host.has_evidence, dis_found=dis_found, L_plus=res.L_plus,
                L_minus=res.L_minus, delta_L=res.delta_L, degenerate=res.degenerate)
    for name in adapter.PROBES:
      rows[f"L_int_{name}"] = res.row("L_int", name)
      rows[f"ceu_{name}"] = np.where(np.asarray(res.degenerate), np.nan,
                                     np.asarray(res.ceu_of(name)))
      rows[f"delta_{name}"] = res.delta_of(name)
    return {k: np.asarray(v) for k, v in rows.items()}

  def rows(self, variables: Any, data: evalsets.FixedEvalSet, *,
           log: Callable[[str], None] | None = None,
           log_every_s: float = 0.0) -> dict[str, Rows]:
    """{corruption: rows} over the whole eval set, batch by batch.

    `log` receives progress lines (elapsed, ETA): after every batch, or at most one
    per `log_every_s` seconds plus the last batch of each corruption. The resumable
    version is the audit job (`ceu_jax.audit_job.AuditJob`, one unit per batch)."""
    size, n = self.settings.batch_size, data.num_examples
    if self.batch_sharding is not None:    # once, not per batch
      variables = placement.place_variables(variables, self.batch_sharding)
    out: dict[str, Rows] = {}
    prog = progress.Progress(n * len(data.corruptions))
    last_line = 0.0
    for c_index, corruption in enumerate(data.corruptions):
      got = []
      for start in range(0, n, size):
        take = lambda t: jax.tree.map(lambda x: x[start:start + size], t)
        got.append(self.batch_rows(variables, take(data.clean), take(data.corrupt[corruption]),
                                   corruption))
        done = min(start + size, n)
        prog.update(c_index * n + done)
        if log is not None and (done == n or prog.elapsed() - last_line >= log_every_s):
          last_line = prog.elapsed()
          log(f"[audit] {corruption}: {done}/{n} examples audited ({prog.line()})")
      out[corruption] = concat_rows(got)
    return out

  def summarize(self, rows: Mapping[str, Rows]) -> dict[str, dict]:
    """`metrics.summarize_audit` per corruption: accuracy and NLL over every example,
    CEU over the examples with evidence (and a distractor, for dis)."""
    return {name: summarize_rows(r, eps=self.settings.eps,
                                 num_resamples=self.settings.num_resamples)
            for name, r in rows.items()}


def summarize_rows(rows: Rows, *, eps: float, num_resamples: int = 1000) -> dict:
  """The one summary of audit rows (training eval, audit job, grid)."""
  summary = metrics.summarize_audit(
      {k: v for k, v in rows.items() if k != "example_id"}, eps=eps,
      num_resamples=num_resamples)
  return summary
