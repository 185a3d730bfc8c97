"""Auditing a retrieval model on a fixed evaluation set (SPEC §1, §5).

For every corruption C and every example: L+, L−, and L_int for three span
probes at the read port — the evidence line (ev), a distractor line of the same
format (dis) and a random non-evidence span of the evidence's length (ctrl) —
then CEU per probe, the degenerate flag, and correctness on D+.

Work is done batch by batch; each finished batch is written atomically under
`out_dir/parts/` so an interrupted audit resumes where it stopped. The end
products are `examples.csv`, `summary.json` and histograms under `plots/`.

Shape legend: B batch, N context, L line slots, K probes.
"""
from __future__ import annotations

import csv
import io as _io
import os
import time
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from ceu_jax import engine, io, metrics, plotting
from ceu_jax.data.types import LineKind, RetrievalBatch
from ceu_jax.scores import answer_correct, gold_loglik

PROBES = ("ev", "dis", "ctrl")
EXAMPLE_FIELDS = ("example_id", "corruption", "correct", "has_evidence", "L_plus", "L_minus",
                  "L_int_ev", "L_int_dis", "L_int_ctrl", "ceu_ev", "ceu_dis", "ceu_ctrl",
                  "delta_L", "delta_ev", "delta_dis", "degenerate")


def make_loglik_fn(model) -> Callable:
  """gold log-likelihood [B] of a conventions-§2 model; one object per model so the
  engine's compiled audit is reused across batches."""
  def loglik_fn(variables, inputs):
    query, context, passage_ids, answer = inputs
    return gold_loglik(model.apply(variables, query, context, passage_ids, answer), answer)
  return loglik_fn


def distractor_line_mask(clean: RetrievalBatch, corrupt: RetrievalBatch,
                         key: jax.Array) -> jax.Array:
  """[B, N]: one evidence-format non-evidence line per example (a hard negative when
  there is one), untouched by the corruption; all-False when none exists."""
  kinds = clean.line_kind
  hard = (kinds == LineKind.HARD_SAME_KEY) | (kinds == LineKind.HARD_SAME_ID)
  plain = kinds == LineKind.DISTRACTOR
  num_lines = kinds.shape[-1]
  lines = jnp.arange(num_lines)
  touched = jnp.zeros_like(kinds, bool).at[
      jnp.arange(kinds.shape[0])[:, None], jnp.maximum(clean.line_ids, 0)].max(
          corrupt.changed_mask & (clean.line_ids >= 0))
  score = jax.random.gumbel(key, kinds.shape) + 10.0 * hard      # prefer hard negatives
  score = jnp.where((hard | plain) & ~touched, score, -jnp.inf)
  chosen = jnp.argmax(score, axis=-1)
  exists = jnp.isfinite(jnp.max(score, axis=-1))
  del lines, num_lines
  return (clean.line_ids == chosen[:, None]) & exists[:, None]


def batch_probes(clean: RetrievalBatch, corrupt: RetrievalBatch, key: jax.Array) -> engine.Probes:
  k_dis, k_ctrl = jax.random.split(key)
  probes = engine.evidence_probes(
      clean.evidence_mask, distractor_mask=distractor_line_mask(clean, corrupt, k_dis),
      control_key=k_ctrl, candidate_mask=clean.line_ids >= 0)
  return probes.replace(names=PROBES)


def _correct(model, variables, batch: RetrievalBatch) -> jax.Array:
  return answer_correct(model.apply(variables, *batch.model_inputs()), batch.answer)


def audit_batch(model, variables, loglik_fn, site, clean: RetrievalBatch,
                corrupt: RetrievalBatch, key: jax.Array, *, chunk_size: int = 16,
                eps: float = 1e-3, allow_approximate: bool = False) -> dict[str, np.ndarray]:
  """Per-example rows (column -> [B] array) of one batch under one corruption."""
  probes = batch_probes(clean, corrupt, key)
  res = engine.audit(loglik_fn, variables, clean=clean.model_inputs(), corrupt=corrupt.model_inputs(),
                     site=engine.Site.parse(site), probes=probes, chunk_size=chunk_size, eps=eps,
                     allow_approximate=allow_approximate)
  correct = jax.jit(_correct, static_argnums=0)(model, variables, clean)
  rows = dict(example_id=clean.example_id, correct=correct, has_evidence=clean.has_evidence,
              L_plus=res.L_plus, L_minus=res.L_minus, delta_L=res.delta_L,
              degenerate=res.degenerate)
  for i, name in enumerate(PROBES):
    rows[f"L_int_{name}"] = res.L_int[i]
    rows[f"ceu_{name}"] = jnp.where(res.degenerate, jnp.nan, res.ceu[i])
  rows["delta_ev"], rows["delta_dis"] = res.delta_int[0], res.delta_int[1]
  return {k: np.asarray(v) for k, v in rows.items()}


def _slice(batch: RetrievalBatch, start: int, stop: int) -> RetrievalBatch:
  return jax.tree_util.tree_map(lambda x: x[start:stop], batch)


def _part_path(out_dir: str, corruption: str, index: int) -> str:
  return os.path.join(out_dir, "parts", corruption, f"{index:05d}.npz")


def _save_part(path: str, rows: Mapping[str, np.ndarray]) -> None:
  io.write_atomic(path, lambda f: np.savez(f, **rows))


def audit_eval_set(model, variables, site, clean: RetrievalBatch,
                   corrupted: Mapping[str, RetrievalBatch], out_dir: str, *,
                   fingerprint: dict, batch_size: int = 128, chunk_size: int = 16,
                   eps: float = 1e-3, seed: int = 0, allow_approximate: bool = False,
                   log=print) -> dict:
  """Audit every corruption of a fixed eval set; resumable; returns the summary."""
  os.makedirs(out_dir, exist_ok=True)
  _check_fingerprint(out_dir, fingerprint, log)
  loglik_fn = make_loglik_fn(model)
  num = clean.batch_size
  all_rows: dict[str, dict[str, np.ndarray]] = {}
  for c_index, (name, corrupt) in enumerate(sorted(corrupted.items())):
    parts, start_time = [], time.time()
    for b, start in enumerate(range(0, num, batch_size)):
      path = _part_path(out_dir, name, b)
      if not os.path.exists(path):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), c_index), b)
        rows = audit_batch(model, variables, loglik_fn, site,
                           _slice(clean, start, start + batch_size),
                           _slice(corrupt, start, start + batch_size), key,
                           chunk_size=chunk_size, eps=eps, allow_approximate=allow_approximate)
        _save_part(path, rows)
      with np.load(path) as part:
        parts.append({k: part[k] for k in part.files})
      done = min(start + batch_size, num)
      log(f"[audit] {name}: {done}/{num} examples audited ({time.time() - start_time:.1f}s)")
    all_rows[name] = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  return write_outputs(out_dir, all_rows, fingerprint, eps)


def _check_fingerprint(out_dir: str, fingerprint: dict, log) -> None:
  """Parts from another checkpoint or eval set are invalid: say so and clear them."""
  path = os.path.join(out_dir, "parts", "fingerprint.json")
  if os.path.exists(path) and io.read_json(path) != fingerprint:
    log(f"[audit] {path} describes another checkpoint/eval set; discarding its parts")
    import shutil
    shutil.rmtree(os.path.join(out_dir, "parts"))
  if not os.path.exists(path):
    io.write_json_atomic(path, fingerprint)


def examples_csv(all_rows: Mapping[str, Mapping[str, np.ndarray]]) -> str:
  buf = _io.StringIO()
  w = csv.writer(buf, lineterminator="\n")
  w.writerow(EXAMPLE_FIELDS)
  for name, rows in sorted(all_rows.items()):
    for i in range(len(rows["example_id"])):
      w.writerow([name if f == "corruption" else _cell(rows[f][i]) for f in EXAMPLE_FIELDS])
  return buf.getvalue()


def _cell(v):
  if isinstance(v, (np.bool_, bool)):
    return int(v)
  if isinstance(v, (np.floating, float)):
    return "" if not np.isfinite(v) else f"{float(v):.6g}"
  return int(v)


def summarize(all_rows, eps: float) -> dict:
  return {name: metrics.summarize_audit(
      {k: v for k, v in rows.items() if k not in ("example_id", "has_evidence")}, eps=eps)
          for name, rows in sorted(all_rows.items())}


def write_outputs(out_dir: str, all_rows, fingerprint: dict, eps: float) -> dict:
  io.write_text_atomic(os.path.join(out_dir, "examples.csv"), examples_csv(all_rows))
  summary = dict(settings=fingerprint, corruptions=summarize(all_rows, eps))
  io.write_json_atomic(os.path.join(out_dir, "summary.json"), summary)
  plot_histograms(all_rows, os.path.join(out_dir, "plots"))
  return summary


def plot_histograms(all_rows, plots_dir: str) -> list[str]:
  paths = []
  bins = np.linspace(0, 1, 21)
  for name, rows in sorted(all_rows.items()):
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for probe in PROBES:
      v = rows[f"ceu_{probe}"]
      v = v[np.isfinite(v)]
      ax.hist(v, bins=bins, alpha=0.5, label=f"{probe} (n={len(v)}, mean={np.mean(v) if len(v) else np.nan:.2f})")
    ax.set_xlabel("CEU (fraction of the lost log-likelihood restored)")
    ax.set_ylabel("examples (count)")
    ax.set_title(f"CEU per probe under {name} "
                 f"({int(np.sum(rows['degenerate']))} degenerate excluded)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths += plotting.save_figure(fig, os.path.join(plots_dir, f"ceu_hist_{name}"))
  return paths
