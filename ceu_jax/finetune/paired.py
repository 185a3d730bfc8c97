"""Paired comparisons of SmolLM2 CER evaluations (base vs baseline vs CER) on shared items (#33).

Every evaluation of one `configs/smollm2_cer.py` variant scores the same held-out pairs
(`eval.num_examples` of `data.eval_split`), and `evaluate.evaluate_reader` keeps its
per-item rows in <workdir>/eval_{trained|base}/batches/ (clean: <b>.json, one row per
item × layer; robustness: delta_<δ>_<b>.json, one row per item). Two evaluations A, B
are paired by item id on the items both scored; per metric the difference B − A has a
paired percentile-bootstrap 95% CI over those items (the same resampled indices for
both arms) — the grid's machinery, not a second one: `claims.paired` for the bootstrap
and `grid.paired.item_pairs` for what a metric is on an item:

  em, f1, nll (−log p(y* | D+)) every item;
  supported    EM correct and CEU_ev ≥ 0.5 on a non-degenerate gap;
  ceu_ev       the §1 mean: items whose gap is non-degenerate in BOTH arms;
  ceu_ev_fixed every item, a degenerate gap counted as 0 (a fixed denominator);
  ceu_dis      §1 mean over items with a distractor span, non-degenerate in both;
  em δ=…, f1 δ=… the robustness EM / F1 under distractor injection at each δ_test;
  <metric> [<stratum>] a memorisable-prior world's evaluation (issue #36): em, supported,
               ceu_ev, ceu_ev_fixed on the items of one stratum (memorised /
               evidence_only), and em / f1 [no_evidence] on the memorised items without
               their evidence (rows batches/no_evidence_<b>.json).

Runs labelled <setting>/<seed> (e.g. `baseline/s0`, `cer/s0`) group a setting trained
with several seeds: two settings are paired seed by seed on each seed's shared items
and a verdict is `claims.RULE` over the seeds (every seed with the predicted sign and
|mean| ≥ its bound in sd); a setting of one run is decided by its paired 95% CI. SPEC
§6's H2 for every (baseline, CER) pair, both denominators, and H1 for every baseline
(`grid.paired.h2_claims` / `h1_claims`, their thresholds); in a memorisable-prior world
both again on each scored stratum (memorised / evidence_only).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Sequence

import numpy as np

from ceu_jax import claims, io
from ceu_jax.grid import aggregate, paired as grid_paired
from ceu_jax.metrics.resampling import fmt_ci

MODEL = 'SmolLM2-135M'
GRID_METRICS = ('em', 'supported', 'ceu_ev', 'ceu_ev_fixed', 'ceu_dis')  # item_pairs's
LABELS = {'ceu_ev': 'ceu_ev (§1: non-degenerate in both)',
          'ceu_ev_fixed': 'ceu_ev_fixed (degenerate = 0)',
          'ceu_dis': 'ceu_dis (§1: non-degenerate in both)'}
_CLEAN = re.compile(r'^\d+\.json$')
_DELTA = re.compile(r'^delta_(.+)_\d+\.json$')
_FREE = re.compile(r'^no_evidence_\d+\.json$')
STRATUM_METRICS = ('em', 'supported', 'ceu_ev', 'ceu_ev_fixed')  # per stratum (world)
NO_EVIDENCE = 'no_evidence'


def items_from_rows(rows: Sequence[dict], read_layer: int,
                    robust: dict[str, Sequence[dict]] | None = None,
                    free: Sequence[dict] = ()) -> dict[str, np.ndarray]:
  """Per-item arrays, sorted by id, of an evaluation's clean rows at `read_layer` (the
  trained port) and its robustness rows {δ: rows}: `grid.paired.load_examples`'s fields
  (example_id, correct, has_evidence, dis_found, degenerate, ceu_ev, ceu_dis; NaN where
  degenerate or without a span) plus f1, nll and 'em δ=<δ>' / 'f1 δ=<δ>' (NaN for an
  item without a row)."""
  at = sorted((r for r in rows if int(r['layer']) == int(read_layer)), key=lambda r: r['id'])
  if not at:
    raise ValueError(f'no per-item rows at the read layer {read_layer}')
  out = dict(example_id=np.asarray([r['id'] for r in at]))
  out['correct'] = np.asarray([float(r['em']) == 1.0 for r in at])
  for key, field in (('has_evidence', 'has_ev'), ('dis_found', 'has_dis'),
                     ('degenerate', 'degenerate')):
    out[key] = np.asarray([bool(r.get(field, True)) for r in at])
  for key in ('ceu_ev', 'ceu_dis', 'em', 'f1'):
    out[key] = np.asarray([aggregate.number(r[key]) for r in at])
  out['nll'] = np.asarray([-float(r['L_plus']) for r in at])
  if any('stratum' in r for r in at):   # a prior world: each item's stratum
    out['stratum'] = np.asarray([r.get('stratum', '') for r in at])
  if free:   # no_evidence rows: the memorised items without their evidence, by id
    by_id = {r['id']: r for r in free}
    for m in ('em', 'f1'):
      out[f'{m} [{NO_EVIDENCE}]'] = np.asarray(
          [aggregate.number(by_id.get(i, {}).get(m)) for i in out['example_id']])
  for d, rs in sorted((robust or {}).items(), key=lambda kv: float(kv[0])):
    by_id = {r['id']: r for r in rs}
    for m in ('em', 'f1'):
      out[f'{m} δ={d}'] = np.asarray([aggregate.number(by_id.get(i, {}).get(m)) for i in out['example_id']])
  return out


def read_rows(eval_dir: str) -> tuple[list, dict, list] | None:
  """(clean rows: item × layer, {δ: robustness rows}, no_evidence rows) of
  <eval_dir>/batches/; None when the directory holds no per-item rows."""
  bdir = os.path.join(eval_dir, 'batches')
  names = sorted(os.listdir(bdir)) if os.path.isdir(bdir) else []
  if not any(_CLEAN.match(n) for n in names):
    return None
  rows, robust, free = [], {}, []
  for n in names:
    m = _DELTA.match(n)
    if _CLEAN.match(n):
      rows += io.read_json(os.path.join(bdir, n))
    elif m:
      robust.setdefault(m.group(1), []).extend(io.read_json(os.path.join(bdir, n)))
    elif _FREE.match(n):
      free += io.read_json(os.path.join(bdir, n))
  return rows, robust, free


def load_items(eval_dir: str, read_layer: int | None = None) -> dict[str, np.ndarray] | None:
  """`items_from_rows` of <eval_dir>/batches/ (read_layer from its summary.json when
  None); None when the directory holds no per-item rows."""
  got = read_rows(eval_dir)
  if got is None:
    return None
  if read_layer is None:
    read_layer = int(io.read_json(os.path.join(eval_dir, 'summary.json'))['read_layer'])
  rows, robust, free = got
  return items_from_rows(rows, read_layer, robust, free)


def shared(a: dict, b: dict) -> tuple[dict, dict]:
  """Both arms restricted to the items both scored, in the same (id) order."""
  ids = np.intersect1d(a['example_id'], b['example_id'])
  take = lambda x: {k: v[np.searchsorted(x['example_id'], ids)] for k, v in x.items()}
  return take(a), take(b)


def metrics_of(*arms: dict) -> list[str]:
  """The metrics every arm has: the grid's, f1, nll, the robustness columns, then (a
  prior world) the per-stratum metrics and the no_evidence columns."""
  extra = [k for k in arms[0] if ' δ=' in k and all(k in x for x in arms)]
  if all('stratum' in x for x in arms):
    names = [s for s in ('memorised', 'evidence_only') if (arms[0]['stratum'] == s).any()]
    extra += [f'{m} [{s}]' for s in names for m in STRATUM_METRICS]
  extra += [k for k in arms[0] if k.endswith(f'[{NO_EVIDENCE}]') and all(k in x for x in arms)]
  return ['em', 'f1', 'nll', 'supported', 'ceu_ev', 'ceu_ev_fixed', 'ceu_dis'] + extra


def item_pairs(metric: str, a: dict, b: dict) -> tuple[np.ndarray, np.ndarray]:
  """(values in A, values in B) of `metric` on A's and B's shared items."""
  a, b = shared(a, b)
  base, _, stratum = metric.partition(' [')
  if stratum and stratum != f'{NO_EVIDENCE}]':   # '<metric> [<stratum>]': that stratum only
    if not np.array_equal(a['stratum'], b['stratum']):
      raise ValueError('the two evaluations label their shared items with different strata')
    keep = a['stratum'] == stratum[:-1]
    a, b = ({k: v[keep] for k, v in x.items()} for x in (a, b))
    metric = base
  if metric in GRID_METRICS:
    return grid_paired.item_pairs(metric, a, b)
  x, y = a[metric], b[metric]
  keep = np.isfinite(x) & np.isfinite(y)
  return x[keep], y[keep]


SCORED_STRATA = ('memorised', 'evidence_only')   # a prior world's strata with CEU


def setting_and_seed(label: str) -> tuple[str, str]:
  """'cer/s1' -> ('cer', 's1'): runs of one setting trained with several seeds are
  labelled <setting>/<seed>; a label without '/' is a setting of one run ('run')."""
  setting, sep, seed = label.rpartition('/')
  return (setting, seed) if sep and setting and seed else (label, 'run')


def _seeds(x: dict, label: str) -> dict[str, dict]:
  """{seed: items} of one evaluation's items, or of a {seed: items} mapping as is."""
  return {label: x} if 'example_id' in x else dict(x)


def restrict(items: dict, stratum: str) -> dict:
  """A prior world's items of one stratum (every per-item field)."""
  keep = items['stratum'] == stratum
  return {k: v[keep] for k, v in items.items()}


def compare(a: dict, b: dict, *, seed: int = 0, num_resamples: int = 1000,
            label: str = 'run') -> dict[str, claims.Difference]:
  """{metric: B − A}, paired over the shared items of each training seed. a, b: one
  evaluation's items (one seed, `label`) or {seed label: items} of a setting trained with
  several seeds; the seeds both settings have are paired (ValueError when none)."""
  a, b = _seeds(a, label), _seeds(b, label)
  seeds = [s for s in a if s in b]
  if not seeds:
    raise ValueError(f'no training seed in common: {sorted(a)} vs {sorted(b)}')
  metrics = metrics_of(*(a[s] for s in seeds), *(b[s] for s in seeds))
  return {m: claims.paired(m, [(s, *item_pairs(m, b[s], a[s])) for s in seeds], seed=seed,
                           num_resamples=num_resamples) for m in metrics}


def comparisons(arms: Sequence[tuple[str, dict]], **kw) -> list[dict]:
  """Every pair of arms in the given order, later − earlier: [{a, b, diffs}]."""
  return [dict(a=la, b=lb, diffs=compare(xa, xb, **kw))
          for i, (la, xa) in enumerate(arms) for lb, xb in arms[i + 1:]]


def _cell(d: claims.Difference) -> str:
  if len(d.per_seed) > 1:   # several seeds: mean ± sd over seeds, then each seed's CI
    return d.text()
  s = d.per_seed[0].diff if d.per_seed else None
  return 'n/a' if s is None or s.value is None else f'{fmt_ci(s, 3, signed=True)} n={s.n}'


def table(comps: Sequence[dict]) -> str:
  """Markdown: one row per metric, one column per comparison (paired Δ [95% CI] n; with
  several seeds, mean ± sd over seeds and each seed's paired Δ)."""
  metrics = list(dict.fromkeys(m for c in comps for m in c['diffs']))
  lines = ['| metric | ' + ' | '.join(f"{c['b']} − {c['a']}" for c in comps) + ' |',
           '|---|' + '---|' * len(comps)]
  for m in metrics:
    cells = [_cell(c['diffs'][m]) if m in c['diffs'] else 'n/a' for c in comps]
    lines.append(f'| {LABELS.get(m, m)} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def verdicts(arms: Sequence[tuple[str, dict]], roles: dict[str, str], *, seed: int = 0,
             num_resamples: int = 1000) -> list[claims.Claim]:
  """H1 for every baseline arm and H2 (both denominators) for every (baseline, CER) pair,
  decided by `claims.RULE` over the arms' training seeds (one seed: its paired 95% CI).
  roles: label -> 'base' | 'baseline' | 'cer'; an arm is one evaluation's items or
  {seed: items}. A prior world adds both claims on each scored stratum (memorised,
  evidence_only: the parametric shortcut lives in the first)."""
  kw = dict(seed=seed, num_resamples=num_resamples)
  by = {l: _seeds(x, 'run') for l, x in arms}
  base = [l for l, _ in arms if roles.get(l) == 'baseline']
  cer = [l for l, _ in arms if roles.get(l) == 'cer']
  world = all('stratum' in x for l in base + cer for x in by[l].values())
  scopes = [('', lambda x: x)] + ([(f' [{st}]', functools.partial(restrict, stratum=st))
                                   for st in SCORED_STRATA] if world and base else [])
  out: list[claims.Claim] = []
  for tag, view in scopes:
    out += grid_paired.h1_claims(
        None, [dict(config={'model.family': f'{MODEL} {l}{tag}', 'seed': s}, cell_id=(l, s))
               for l in base for s in by[l]],
        load=lambda _, cell, view=view: view(by[cell[0]][cell[1]]), **kw)
  for tag, view in scopes:
    comps = [dict(name=MODEL + tag, variant=f'{c} vs {b}',
                  diffs=compare({s: view(x) for s, x in by[b].items()},
                                {s: view(x) for s, x in by[c].items()}, **kw))
             for b in base for c in cer]
    out += grid_paired.h2_claims(comps)
  return out


def role(summary_path: str, summary: dict) -> str | None:
  """'base' (an untrained evaluation), 'baseline' (cer.regularizer none) or 'cer', from
  the run's config.json beside eval_*/; None when it cannot be told."""
  if not summary.get('trained', True):
    return 'base'
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(summary_path))),
                      'config.json')
  if not os.path.exists(path):
    return None
  reg = io.read_json(path).get('cer', {}).get('regularizer')
  return None if reg is None else ('baseline' if reg == 'none' else 'cer')


def section(entries: Sequence[tuple[str, str]], *, seed: int = 0,
            num_resamples: int = 1000) -> str:
  """The report's paired section for (label, eval_*/summary.json) entries: the table of
  every pair of settings and the claims, or a line saying which entry has no per-item
  rows (one setting: its H1 only, if it is a baseline). Labels <setting>/<seed> group the runs of one setting trained with several seeds
  (`setting_and_seed`): settings are paired seed by seed and the claims decided over
  seeds."""
  arms: dict[str, dict] = {}
  roles: dict[str, str | None] = {}
  for label, path in entries:
    items = load_items(os.path.dirname(path))
    if items is None:
      return (f'Paired comparisons: no per-item rows beside {path} (batches/); rerun '
              'its evaluation (finished batches are kept) to get them.\n')
    setting, run_seed = setting_and_seed(label)
    if run_seed in arms.setdefault(setting, {}):
      raise ValueError(f'--report: two runs labelled {label!r}')
    arms[setting][run_seed] = items
    r = role(path, io.read_json(path))
    if roles.setdefault(setting, r) != r:
      raise ValueError(f'--report: the runs of {setting!r} mix roles ({roles[setting]} and '
                       f'{r}); label each setting\'s runs <setting>/<seed>')
  kw = dict(seed=seed, num_resamples=num_resamples)
  settings = list(arms.items())
  if len(arms) < 2:   # nothing to pair: a baseline's H1 only (it needs no second run)
    cs = verdicts(settings, roles, **kw)
    return (f'Claims of one setting (no second one to pair with):\n\n{claims.table(cs)}\n'
            if cs else '')
  n_seeds = max(len(x) for _, x in settings)
  how = ('paired bootstrap 95% CI over items' if n_seeds == 1 else
         'mean ± sd over the training seeds both settings have, then each seed\'s paired '
         'bootstrap 95% CI over items')
  out = ['Paired differences on the shared held-out items (later − earlier setting; '
         f'{how}, {num_resamples} resamples, seed {seed}; n = items paired):', '',
         table(comparisons(settings, **kw))]
  cs = verdicts(settings, roles, **kw)
  if cs:
    out += ['', claims.table(cs)]
  return '\n'.join(out) + '\n'
