"""Held-out evaluation of a SmolLM2 fine-tune (or the base model) on factual-QA pairs.

  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu --workdir W
  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu --workdir W0 --eval=base

Items: the first `eval.num_examples` token-aligned entity-swap pairs of
`data.eval_split` (`cer_task.build_pairs`, same short contexts as training).
Per item: the greedy answer to the clean prompt (EM / token F1 against the gold,
SQuAD normalisation, `metrics.text`), NLL = −log p(y* | D+), and the engine's
CEU of the ev / dis / control probes at every layer's read port (the fast
causal audit, `audit_nq.audit_batch`, tested against the engine). Supported
answer (SPEC §6) = EM correct AND CEU_ev ≥ τ (0.5) at the trained port
`model.read_layer`. Robustness: EM / F1 by generation again with distractors
injected at each δ of `eval.delta_test` (`cer_task.injected_prompts`: every
non-evidence sentence of the short context replaced, with probability δ, by
another item's evidence sentence). Every aggregate carries a bootstrap 95% CI
and its n.

Memorisable-prior world (`data.world`, issue #36): the items are the world's fixed
held-out strata (`prior_world`): `memorised` (the first data.world.n_eval_memorised
memorised training items, context with the evidence), `evidence_only` (the first
eval.num_examples aligned pairs of data.eval_split whose question was not trained on)
— both audited as above, each row labelled with its `stratum` — and `no_evidence` (the
memorised items again, context without the evidence: EM / F1 by generation and NLL
only, rows in batches/no_evidence_<b>.json). summary.json then has `strata`: per
stratum EM, F1, NLL, CEU_ev with both denominators (§1: non-degenerate items;
`ceu_ev_fixed`: every item, a degenerate gap counted as 0), CEU_dis, control,
supported rate, the degenerate share and the correct-but-unsupported share.

Outputs in <workdir>/eval_{trained|base}/ (atomic writes; a rerun skips finished
batches): batches/*.json (the per-item rows), summary.json (metrics + per-layer
profile), and plots/layer_profile.{png,pdf} (`audit_nq.plot_profile`). `report`
tabulates several evaluations from these files alone, with the paired differences of
every two runs on their shared items (`finetune.paired`).
"""
from __future__ import annotations

import os
import time
import types
from typing import Any

import numpy as np


from ceu_jax import audit_config, io, jobs
from ceu_jax.engine.probes import DIS, EV, SPAN_PROBES
from ceu_jax.finetune import paired
from ceu_jax.finetune import task as cer_task
from ceu_jax.metrics import mean_ci
from ceu_jax.metrics.resampling import fmt_ci
from ceu_jax.metrics.text import exact_match, token_f1
from ceu_jax.pretrained import audit_nq
from ceu_jax.pretrained import lora as lora_lib
from ceu_jax.readers.smollm2 import SmolLM2Reader

TAU = 0.5  # CEU_ev threshold of a supported answer (SPEC §6 default)


def _log(msg: str) -> None:
  print(f'[smollm2_cer eval] {msg}', flush=True)


def _variables(task, workdir: str, trained: bool) -> tuple[dict, Any]:
  if not trained:
    return {'params': task.base}, None
  from ceu_jax.train.loop import restore_trainable
  tree, step = restore_trainable(task, workdir)
  return {'params': lora_lib.merged(tree, task.base, task.lora)}, step


def evaluate_reader(task, workdir: str, *, trained: bool = True) -> dict:
  """Evaluates the newest checkpoint of `workdir` (or the base model); returns the summary."""
  c = task.config
  out_dir = os.path.join(workdir, 'eval_trained' if trained else 'eval_base')
  os.makedirs(os.path.join(out_dir, 'batches'), exist_ok=True)
  t0 = time.time()
  variables, step = _variables(task, workdir, trained)
  world = getattr(task, 'world', None)
  if world is None:
    pairs, report = cer_task.build_pairs(task.tokenizer, c, c.data.eval_split,
                                         limit=int(c.eval.num_examples))
    stratum = {}
  else:
    pairs, stratum, report = world_eval_pairs(task)
  if sum(v != 'memorised' for v in stratum.values()) + (not stratum) * len(pairs) < int(
      c.eval.num_examples):
    _log(f'fewer aligned held-out pairs than asked ({c.eval.num_examples}): {report}')
  bs, n_tail, pad_to = int(c.eval.batch_size), int(c.data.max_answer_tokens), int(c.data.max_len)
  eps = float(c.eval.eps)
  reader = []   # the SmolLM2Reader, built on first use (a resumed run may not need it)

  def get_reader() -> SmolLM2Reader:
    if not reader:
      reader.append(SmolLM2Reader(variables, task.model_config, task.tokenizer))
    return reader[0]

  def answers(ps, prompts) -> list[dict]:
    """Greedy answers to `prompts` scored against the pairs' golds (EM, token F1)."""
    gens = get_reader().generate(prompts, max_new_tokens=int(c.eval.max_new_tokens), stop=['\n'],
                              ids=[p.id for p in ps])
    return [dict(prediction=g.text.strip(), em=exact_match(g.text.strip(), [p.answer]),
                 f1=token_f1(g.text.strip(), [p.answer])) for p, g in zip(ps, gens)]

  def audited(b: int) -> list[dict]:
    ps = pairs[b * bs:(b + 1) * bs]
    arrays = audit_nq.batch_arrays(task.tokenizer, ps, bs, pad_to)
    prof = audit_nq.audit_batch(variables, task.model_config, arrays, n_tail,
                                SPAN_PROBES, eps)
    new = audit_nq.batch_rows(ps, prof, SPAN_PROBES)
    by_id = {p.id: a for p, a in zip(ps, answers(ps, [p.clean_prompt for p in ps]))}
    return [{**r, **by_id[r['id']], **_label(stratum, r['id'])} for r in new]

  n_batches = (len(pairs) + bs - 1) // bs
  rows = _resumable(out_dir, '', n_batches, audited, t0)
  free_rows = []
  if world is not None:   # the no_evidence stratum: memory alone (generation and NLL)
    free = [task.world_pairs.free[i] for i in world.eval_memorised]

    def memory_only(b: int) -> list[dict]:
      ps = free[b * bs:(b + 1) * bs]
      ll = get_reader().loglik([p.clean_prompt for p in ps], [p.answer for p in ps],
                               ids=[p.id for p in ps])   # log p(y* | q, D without evidence)
      gens = answers(ps, [p.clean_prompt for p in ps])
      return [dict(id=p.id, stratum='no_evidence', answer=p.answer, L_plus=float(l), **a)
              for p, l, a in zip(ps, ll, gens)]
    free_rows = _resumable(out_dir, 'no_evidence_', (len(free) + bs - 1) // bs,
                           memory_only, t0)
  robust = {}
  for delta in tuple(c.eval.get('delta_test', ())):
    # Robustness: the same items with distractors injected at strength δ.
    prompts, counts = cer_task.injected_prompts(c, pairs, float(delta))

    def injected(b: int, prompts=prompts, counts=counts) -> list[dict]:
      lo, hi = b * bs, (b + 1) * bs
      return [dict(id=p.id, answer=p.answer, n_injected=int(n), **_label(stratum, p.id), **a)
              for p, n, a in zip(pairs[lo:hi], counts[lo:hi],
                                 answers(pairs[lo:hi], prompts[lo:hi]))]
    robust[f'{float(delta):g}'] = _resumable(out_dir, f'delta_{float(delta):g}_', n_batches,
                                             injected, t0)
  summary = summarize(rows, task.model_config.n_layers, c)
  summary['delta_test'] = {d: _robust_summary(r, c) for d, r in robust.items()}
  if world is not None:
    summary['strata'] = strata_summary(rows, free_rows, c)
    summary['world'] = dict(task.report)
  summary.update(step=step, trained=trained, pairs=report, wall_s=time.time() - t0,
                 read_layer=int(c.model.read_layer), versions=jobs.versions())
  io.write_json_atomic(os.path.join(out_dir, 'summary.json'), summary)
  audit_nq.plot_profile(summary['profile'], SPAN_PROBES,
                        os.path.join(out_dir, 'plots', 'layer_profile'))
  return summary


def _resumable(out_dir: str, prefix: str, n_batches: int, compute, t0: float) -> list[dict]:
  """Rows of every batch: batches/<prefix><b>.json where a run already wrote it, else
  `compute(b)`, written atomically (an interrupted evaluation resumes per batch)."""
  rows: list[dict] = []
  for b in range(n_batches):
    path = os.path.join(out_dir, 'batches', f'{prefix}{b:05d}.json')
    if os.path.exists(path):
      rows += io.read_json(path)
      continue
    new = compute(b)
    io.write_json_atomic(path, new)
    rows += new
    _log(f'{prefix}batch {b + 1}/{n_batches}: {time.time() - t0:.0f}s elapsed')
  return rows


def _agg(x, config: Any) -> dict:
  """Mean with its bootstrap 95% CI and n."""
  return mean_ci(np.asarray(x, np.float64), num_resamples=int(config.eval.num_resamples),
                 seed=int(config.seed)).to_dict()


def _robust_summary(rows: list[dict], config: Any, by_stratum: bool = True) -> dict:
  agg = lambda x: _agg(x, config)
  out = {'n': len(rows), 'em': agg([r['em'] for r in rows]), 'f1': agg([r['f1'] for r in rows]),
         'mean_injected': float(np.mean([r['n_injected'] for r in rows])) if rows else 0.0}
  names = sorted({r['stratum'] for r in rows if 'stratum' in r})
  if by_stratum and names:
    out['strata'] = {s: _robust_summary([r for r in rows if r.get('stratum') == s], config,
                                        False) for s in names}
  return out


def _label(stratum: dict, item_id: str) -> dict:
  """{'stratum': …} of a prior-world item, {} otherwise."""
  return {'stratum': stratum[item_id]} if item_id in stratum else {}


def world_eval_pairs(task) -> tuple[list, dict, dict]:
  """(pairs, {id: stratum}, report) of a prior world's fixed held-out set: the memorised
  items with their evidence (training pairs), then the first eval.num_examples aligned
  pairs of data.eval_split whose question no training row asks (evidence_only)."""
  c, world = task.config, task.world
  mem = [task.world_pairs.with_ev[i] for i in world.eval_memorised]
  unseen, report = cer_task.build_pairs(task.tokenizer, c, c.data.eval_split,
                                        limit=int(c.eval.num_examples),
                                        exclude_questions=world.seen_questions)
  stratum = {**{p.id: 'memorised' for p in mem}, **{p.id: 'evidence_only' for p in unseen}}
  if len(stratum) != len(mem) + len(unseen):
    raise ValueError('a held-out item id is also a memorised training item id')
  return mem + unseen, stratum, {'evidence_only': report, 'memorised': len(mem)}


def _pair_metrics(at: list[dict], config: Any) -> dict:
  """EM, F1, NLL, CEU (§1 and fixed denominators), supported and degenerate shares of
  audited rows at one layer, each with a bootstrap 95% CI and n."""
  agg = lambda x: _agg(x, config)
  ceu = lambda name: [r[f'ceu_{name}'] for r in at if r[f'ceu_{name}'] is not None]
  supported = [float(r['em'] == 1.0 and r['ceu_ev'] is not None and r['ceu_ev'] >= TAU)
               for r in at]
  return {
      'n': len(at), 'em': agg([r['em'] for r in at]), 'f1': agg([r['f1'] for r in at]),
      'nll': agg([-r['L_plus'] for r in at]),
      **{f'ceu_{n}': agg(ceu(n)) for n in SPAN_PROBES},
      'ceu_ev_fixed': agg([0.0 if r['ceu_ev'] is None else r['ceu_ev'] for r in at]),
      f'supported_{TAU}': agg(supported),
      'degenerate': agg([float(r['degenerate']) for r in at]),
      'correct_unsupported': agg([float(r['em'] == 1.0) - s for r, s in zip(at, supported)]),
  }


def summarize(rows: list[dict], n_layers: int, config: Any) -> dict:
  """Headline metrics with 95% CIs at the trained port, and the per-layer profile."""
  cfg = types.SimpleNamespace(num_resamples=int(config.eval.num_resamples),
                              seed=int(config.seed), eps=float(config.eval.eps))
  layer = int(config.model.read_layer)
  return {**_pair_metrics([r for r in rows if r['layer'] == layer], config),
          'profile': audit_nq.summarize(rows, SPAN_PROBES, n_layers, cfg)}


def strata_summary(rows: list[dict], free_rows: list[dict], config: Any) -> dict:
  """{stratum: metrics} of a prior world's evaluation at the trained port (module doc)."""
  layer = int(config.model.read_layer)
  agg = lambda x: _agg(x, config)
  out = {s: _pair_metrics([r for r in rows if r['layer'] == layer and r.get('stratum') == s],
                          config) for s in ('memorised', 'evidence_only')}
  out['no_evidence'] = {'n': len(free_rows), 'em': agg([r['em'] for r in free_rows]),
                        'f1': agg([r['f1'] for r in free_rows]),
                        'nll': agg([-r['L_plus'] for r in free_rows])}
  return out


# ----------------------------------------------------------------------------
# Report: the table and the before/after layer profile of several runs.
# ----------------------------------------------------------------------------

TABLE_METRICS = ('em', 'f1', 'nll', 'ceu_ev', 'ceu_dis', 'ceu_control', f'supported_{TAU}')


def _cell(a: dict) -> str:
  return fmt_ci(a, missing='n/a')


STRATUM_COLUMNS = ('em', 'f1', 'nll', 'ceu_ev', 'ceu_ev_fixed', f'supported_{TAU}',
                   'degenerate', 'correct_unsupported')


def strata_table(sums: list[tuple[str, dict]]) -> str:
  """Markdown: one row per (run, stratum) of prior-world evaluations (n/a: not measured
  in that stratum, e.g. CEU without evidence)."""
  lines = ['| run | stratum | n | ' + ' | '.join(STRATUM_COLUMNS) + ' |',
           '|' + '---|' * (len(STRATUM_COLUMNS) + 3)]
  for label, s in sums:
    for name, m in s.get('strata', {}).items():
      lines.append(f"| {label} | {name} | {m['n']} | "
                   + ' | '.join(_cell(m[k]) if k in m else 'n/a' for k in STRATUM_COLUMNS)
                   + ' |')
  return '\n'.join(lines)


def report(entries: list[tuple[str, str]], out_dir: str, *, seed: int = 0,
           num_resamples: int = 1000) -> str:
  """Markdown tables (95% CIs, n) and one CEU_ev-by-layer plot of several evaluations.

  entries: (label, path of an eval_*/summary.json). Reads only those files and the
  per-item rows beside them (no model is loaded). Writes out_dir/table.md and
  out_dir/layer_profiles.{png,pdf} (a prior world: also layer_profiles_strata.{png,pdf},
  CEU_ev by layer per stratum); returns the tables: one row per run, the
  robustness table, and the paired differences of every pair of runs on their shared
  items with the H1 / H2 verdicts (`finetune.paired.section`; `seed`, `num_resamples`
  of its bootstrap).
  """
  from matplotlib.figure import Figure

  from ceu_jax.plotting import save_figure
  sums = [(label, io.read_json(path)) for label, path in entries]
  head = '| run | n | ' + ' | '.join(TABLE_METRICS) + ' |'
  lines = [head, '|' + '---|' * (len(TABLE_METRICS) + 2)]
  for label, s in sums:
    step = '' if s.get('step') is None else f" (step {s['step']})"
    lines.append(f"| {label}{step} | {s['n']} | "
                 + ' | '.join(_cell(s[m]) for m in TABLE_METRICS) + ' |')
  deltas = sorted({d for _, s in sums for d in s.get('delta_test', {})}, key=float)
  if deltas:   # robustness: EM / F1 by generation under distractor injection at δ_test
    lines += ['', '| run | clean em | clean f1 | '
              + ' | '.join(f'em δ={d} | f1 δ={d}' for d in deltas) + ' |',
              '|' + '---|' * (3 + 2 * len(deltas))]
    for label, s in sums:
      cells = [_cell(s['em']), _cell(s['f1'])]
      for d in deltas:
        r = s.get('delta_test', {}).get(d)
        cells += [_cell(r['em']), _cell(r['f1'])] if r else ['n/a', 'n/a']
      lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  if any('strata' in s for _, s in sums):   # a prior world: one row per run and stratum
    lines += ['', strata_table(sums)]
  hinge = hinge_table(entries)
  if hinge:
    lines += ['', hinge]
  table = '\n'.join(lines) + '\n'
  pair_text = paired.section(entries, seed=seed, num_resamples=num_resamples)
  if pair_text:
    table += '\n' + pair_text
  os.makedirs(out_dir, exist_ok=True)
  io.write_text_atomic(os.path.join(out_dir, 'table.md'), table)
  fig = Figure(figsize=(7, 4))
  ax = fig.add_subplot()
  for label, s in sums:
    for name, ls in ((EV, '-'), (DIS, ':')):
      agg = [e[name]['ceu'] for e in s['profile']['per_layer']]
      layers = [e['layer'] for e in s['profile']['per_layer']]
      val = np.array([a['value'] if a['value'] is not None else np.nan for a in agg])
      lo = np.array([a['ci_low'] if a['ci_low'] is not None else np.nan for a in agg])
      hi = np.array([a['ci_high'] if a['ci_high'] is not None else np.nan for a in agg])
      line, = ax.plot(layers, val, ls=ls, marker='o', ms=3, label=f'{label}: CEU_{name}')
      ax.fill_between(layers, lo, hi, color=line.get_color(), alpha=0.15)
  ax.axvline(sums[0][1].get('read_layer', 0), color='gray', lw=0.8, ls='--')
  ax.set(xlabel='layer ℓ (read port layers_ℓ/attn, answer positions)', ylabel='mean CEU',
         title='SmolLM2-135M before / after fine-tuning (95% bootstrap CI)')
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  save_figure(fig, os.path.join(out_dir, 'layer_profiles'))
  if any('strata' in s for _, s in sums):
    plot_stratum_profiles(entries, os.path.join(out_dir, 'layer_profiles_strata'),
                          seed=seed, num_resamples=num_resamples)
  return table


def hinge_activity(workdir: str) -> dict | None:
  """How often CER's evidence hinge bit during a run, from its logged training batches
  (<workdir>/metrics.jsonl, one batch every train.log_every steps): {batches, active
  (share of logged batches with any row's hinge > 0), rows (mean share of the rows with a
  CER term whose hinge is > 0), swap (mean swap term)}; None for a run without CER terms."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return None
  rows = [r for r in io.read_jsonl(path) if r.get('split') == 'train' and 'cer_ev_active' in r]
  if not rows:
    return None
  act = np.array([float(r['cer_ev_active']) for r in rows])
  return {'batches': len(rows), 'active': float(np.mean(act > 0)), 'rows': float(act.mean()),
          'swap': float(np.mean([float(r.get('swap', 0.0)) for r in rows]))}


def hinge_table(entries: list[tuple[str, str]]) -> str:
  """Markdown: CER's hinge activity per trained run with CER terms ('' when none)."""
  lines = []
  for label, path in entries:
    h = hinge_activity(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    if h:
      lines.append(f"| {label} | {h['batches']} | {h['active']:.3f} | {h['rows']:.3f} | "
                   f"{h['swap']:.3f} |")
  if not lines:
    return ''
  return '\n'.join(['| CER run | logged training batches | share with the evidence hinge '
                    'active | mean share of CER rows active | mean swap term |',
                    '|---|---|---|---|---|'] + lines)


def stratum_profiles(eval_dir: str, *, seed: int = 0,
                     num_resamples: int = 1000) -> dict[str, dict] | None:
  """{stratum: `audit_nq.summarize` of its items} of a prior world's evaluation, from the
  per-item rows (CEU by layer with bootstrap CIs; the evaluation's ε); None without rows."""
  got = paired.read_rows(eval_dir)
  if got is None:
    return None
  rows = got[0]
  eps = float(io.read_json(os.path.join(eval_dir, 'summary.json'))['profile']['eps'])
  cfg = types.SimpleNamespace(num_resamples=num_resamples, seed=seed, eps=eps)
  n_layers = max(int(r['layer']) for r in rows) + 1
  return {st: audit_nq.summarize([r for r in rows if r.get('stratum') == st], SPAN_PROBES,
                                 n_layers, cfg) for st in paired.SCORED_STRATA}


def plot_stratum_profiles(entries: list[tuple[str, str]], stem: str, *, seed: int = 0,
                          num_resamples: int = 1000) -> None:
  """CEU_ev by layer, one panel per scored stratum of a prior world, one line (95%
  bootstrap band) per evaluation -> stem.{png,pdf}."""
  from matplotlib.figure import Figure

  from ceu_jax.plotting import save_figure
  profiles = [(label, stratum_profiles(os.path.dirname(path), seed=seed,
                                       num_resamples=num_resamples)) for label, path in entries]
  fig = Figure(figsize=(11, 4))
  axes = fig.subplots(1, len(paired.SCORED_STRATA), sharey=True)
  for ax, st in zip(axes, paired.SCORED_STRATA):
    for label, prof in profiles:
      if not prof:
        continue
      per = prof[st]['per_layer']
      layers = [e['layer'] for e in per]
      get = lambda k: np.array([np.nan if e[EV]['ceu'][k] is None else e[EV]['ceu'][k]
                                for e in per])
      line, = ax.plot(layers, get('value'), marker='o', ms=3,
                      label=f"{label} (n={prof[st]['n_examples']})")
      ax.fill_between(layers, get('ci_low'), get('ci_high'), color=line.get_color(),
                      alpha=0.15)
    ax.set(title=f'{st} items', xlabel='layer ℓ (read port layers_ℓ/attn)')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  axes[0].set_ylabel('mean CEU_ev (non-degenerate items)')
  fig.suptitle('SmolLM2-135M in the memorisable-prior world: CEU_ev by layer and stratum '
               '(95% bootstrap CI)', fontsize=10, y=1.0)
  fig.tight_layout()
  save_figure(fig, stem)


# ----------------------------------------------------------------------------
# Driver.
# ----------------------------------------------------------------------------


def run(config: Any, workdir: str, *, fresh: bool = False, allow_config_change=(),
        evaluate: str = 'trained', load=None) -> dict:
  """Train (unless evaluate == 'base'), then evaluate ('trained' | 'base' | 'none')."""
  from ceu_jax.train import loop
  config = audit_config.upgrade(config)   # recorded before eval.eps: the ε cer.eps it used
  task = cer_task.SmolLM2CERTask.from_config(config, load=load)
  out: dict = {'pairs': task.report}
  if evaluate != 'base':
    out['train'] = loop.train_and_evaluate(config, workdir, fresh=fresh,
                                           allow_config_change=allow_config_change,
                                           custom=task)
  if evaluate != 'none':
    out['eval'] = evaluate_reader(task, workdir, trained=evaluate == 'trained')
  return out
