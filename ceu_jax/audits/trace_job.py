"""The trace-sensitivity job: world → items per domain → audit rows → outputs (issue #17).

  run_trace_sensitivity(config, workdir)   # experiments/trace_sensitivity.py calls this

Worlds (config.world; configs/trace_sensitivity.py documents every field):
  chain    World A: chained ATR items (ceu_jax.audits.trace_world) read by the
           trace oracles (following / ignoring / a seeded mixture);
  smollm2  World B: SmolLM2-135M-Instruct with few-shot "Step i:" traces on
           templated arithmetic and on factual questions with their gold
           passage (ceu_jax.audits.trace_text).

Work is done in chunks of items per (reader, domain), each saved under
W/chunks atomically; a rerun skips finished chunks (resumable). The config is
checked against W/config.json first (a different config is refused, naming the
fields) and W/.trace_sensitivity.lock keeps a second job out. Outputs (atomic):
  rows.csv       one row per (reader, item, k, τ) and one per unparseable item
  summary.json   per reader: parse failures, identity check, φ / ρ overall and
                 by domain, τ, k, trace length, domain × τ (bootstrap CIs)
  report.md      the φ / ρ table by domain × τ, by trace length, the plot
  rho_by_length.png/pdf   ρ against trace length (one line per reader × domain)
"""
from __future__ import annotations

import csv
import io as _io
import json
import os
import time
from typing import Callable, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ceu_jax import io, plotting
from ceu_jax import workdir as workdir_lib
from ceu_jax.audits import trace_sensitivity as ts
from ceu_jax.progress import Progress

ROW_COLUMNS = ('reader', 'domain', 'id', 'trace_len', 'k', 'tau', 'parsed', 'applied', 'answer',
               'answer_after', 'regen_parsed', 'S', 'phi', 'same', 'strength', 'violation',
               'implied_before', 'implied_after', 'forced', 'continuation', 'raw')
WORLDS = ('chain', 'smollm2')
CHAIN_READERS = ('following', 'ignoring', 'mixture')
FREE_FIELDS = ('plots',)  # may change between a run and its resumption


class ChainWorld:
  """World A: the trace oracles and the trained chain readers (family/regime)."""
  title = 'World A: chained ATR'

  def __init__(self, config):
    from ceu_jax.audits import trace_world as tw
    from ceu_jax.data import chain
    a = config.chain
    for r in a.readers:
      if r not in CHAIN_READERS:
        raise ValueError(f'chain.readers: {r!r} is not one of {CHAIN_READERS}')
    if not 0.0 <= a.mixture_share <= 1.0:
      raise ValueError(f'chain.mixture_share must lie in [0, 1], got {a.mixture_share!r}')
    for name in ('steps', 'batch_size'):
      if int(a[name]) < 1:
        raise ValueError(f'chain.{name} must be >= 1, got {a[name]!r}')
    if int(a.probe_items) < 0:
      raise ValueError(f'chain.probe_items must be >= 0, got {a.probe_items!r}')
    self.tw, self.a, self.variant = tw, a, config.variant
    self.cfg = chain.ChainConfig.from_config(a.data)
    self.trained = tuple(f'{f}/{r}' for f in a.families for r in a.regimes)
    if not a.readers and not self.trained:
      raise ValueError('chain: no readers (chain.readers and chain.families × regimes are empty)')
    self.readers = tuple(a.readers) + self.trained
    self.domain = tw.ChainDomain(self.cfg)
    self.items = {'chain': tw.make_items(self.cfg, int(config.n_items), int(config.seed))}
    self.domains = {'chain': self.domain}
    self.workdir, self.log, self._loaded = None, print, {}

  def prepare(self, workdir, log):
    self.workdir, self.log = workdir, log

  def train_config(self, name):
    """The training config of trained reader `name` = 'family/regime' (the audited world's
    data; the prior only in the prior regime)."""
    from configs import trace_sensitivity as tsc
    family, regime = name.split('/')
    tc = tsc.train_config(family, regime, self.variant == 'tiny', int(self.a.steps))
    with tc.unlocked():
      tc.data = type(tc.data)(self.a.data.to_dict())
      tc.data.prior_share = float(self.a.data.prior_share) if regime == 'prior' else 0.0
    return tc

  def _trained(self, name):
    if name not in self._loaded:
      from ceu_jax.audits.trained import trained_reader
      tc = self.train_config(name)
      sub = os.path.join(self.workdir, 'train', name.replace('/', '_'))
      reader, _ = trained_reader(tc, sub, self.log, batch_size=int(self.a.batch_size))
      self._loaded[name] = (reader, tc, sub)
    return self._loaded[name]

  def reader(self, name):
    tw, d, items = self.tw, self.domain, self.items['chain']
    if name in self.trained:
      return self._trained(name)[0]
    if name == 'following':
      return tw.following_oracle(d, items)
    if name == 'ignoring':
      return tw.ignoring_oracle(d, items)
    return tw.mixture_oracle(d, items, float(self.a.mixture_share), int(self.a.mixture_seed))

  def probes(self, config) -> dict:
    """The §8.4 answer-position probe of every trained reader (cached in W/probes)."""
    from ceu_jax.audits import trace_probe
    from ceu_jax.auditor import audited_model
    out = {}
    n = int(self.a.probe_items)
    if not n:
      return out
    for name in self.trained:
      path = os.path.join(self.workdir, 'probes', name.replace('/', '_') + '.json')
      if not os.path.exists(path):
        reader, tc, _ = self._trained(name)
        bundle = audited_model(tc)
        res = trace_probe.answer_probe(reader.model, reader.variables, bundle.site, self.cfg,
                                       self.items['chain'][:n], boot_seed=int(config.bootstrap_seed))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        io.write_json_atomic(path, res)
      out[name] = io.read_json(path)
    return out

  def reader_stats(self, rows) -> dict:
    """Per reader and group: parsed items, how many answer the gold value and how many
    answer what their own trace implies (consistent when left alone)."""
    gold = {x.id: x for x in self.items['chain']}
    first = {}
    for x in rows:
      if x['tau'] not in ('parse_failure', ts.IDENTITY) and x.get('applied', True):
        first.setdefault((x['reader'], x['id']), x)
    out: dict = {}
    for (r, i), x in first.items():
      item = gold[i]
      g = out.setdefault(r, {}).setdefault(self.domain.group(item),
                                           dict(n=0, answer_gold=0, own_trace=0))
      ans = x['answer'][0] if x['answer'] else None
      g['n'] += 1
      g['answer_gold'] += int(ans == item.value)
      g['own_trace'] += int(ans == x['implied_before'])
    return out

  def describe(self) -> str:
    return ('Chains of h ∈ {%s} hops; the trace is the h − 1 bridge ids, the answer the value; '
            'Strength from the trace-following function (exact). LogicFlip has no meaning in '
            'this world (a trace of ids states no operator) and is not applied. Items whose '
            'value the memorisable prior fixes (%.0f%% of (query ID, last KEY) pairs) form the '
            'group chain_prior. Readers: oracles that follow their trace, ignore it, or a seeded '
            'per-item mixture (share %.2f follows); trained readers family/regime (%d steps).'
            % (', '.join(map(str, self.cfg.hops)), 100 * self.cfg.prior_share,
               self.a.mixture_share, int(self.a.steps)))


def make_world(config):
  """The world of a config (validated before anything is built or written)."""
  if config.world not in WORLDS:
    raise ValueError(f'world must be one of {WORLDS}, got {config.world!r}')
  if int(config.n_items) < 1:
    raise ValueError(f'n_items must be >= 1, got {config.n_items!r}')
  if int(config.chunk_size) < 1:
    raise ValueError(f'chunk_size must be >= 1, got {config.chunk_size!r}')
  for t in config.taus:
    if t not in ts.TAUS:
      raise ValueError(f'taus: {t!r} is not one of {ts.TAUS}')
  for name, lo, hi in (('tau_sim', 0.0, 1.0), ('lam', 0.0, 1.0)):
    if not lo <= float(config[name]) <= hi:
      raise ValueError(f'{name} must lie in [{lo}, {hi}], got {config[name]!r}')
  if config.world == 'chain':
    return ChainWorld(config)
  from ceu_jax.audits import trace_text
  return trace_text.SmolLM2World(config)


def _check_config(config, workdir: str) -> None:
  workdir_lib.refuse_other_job_config(config, workdir, 'a trace-sensitivity', FREE_FIELDS)


def run_trace_sensitivity(config, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Run (or resume) the audit; returns the summary dict (also in W/summary.json)."""
  world = make_world(config)
  os.makedirs(os.path.join(workdir, 'chunks'), exist_ok=True)
  _check_config(config, workdir)
  t0 = time.time()
  cs = int(config.chunk_size)
  positions = tuple(config.positions) or None
  with workdir_lib.WorkdirLock(workdir, 'trace_sensitivity'):
    if workdir_lib.read_config_json(workdir) is None:
      io.write_json_atomic(os.path.join(workdir, workdir_lib.CONFIG_FILE), config.to_dict())
    world.prepare(workdir, log)
    n_max = max(len(x) for x in world.items.values())
    units = [(r, d, lo) for r in world.readers for lo in range(0, n_max, cs)
             for d in world.domains if lo < len(world.items[d])]  # domains interleaved
    path = lambda u: os.path.join(workdir, 'chunks', f'{u[0]}_{u[1]}_{u[2]:05d}.json')
    done = sum(os.path.exists(path(u)) for u in units)
    prog = Progress(total=len(units), done=done)
    log(f'trace sensitivity ({config.world}): {len(units)} chunks, {done} done before')
    readers: dict = {}
    for u in units:
      if os.path.exists(path(u)):
        continue
      if u[0] not in readers:
        readers[u[0]] = world.reader(u[0])
      t1 = time.time()
      rows = ts.run_traces(readers[u[0]], world.domains[u[1]], world.items[u[1]][u[2]:u[2] + cs],
                           taus=tuple(config.taus), positions=positions,
                           tau_sim=float(config.tau_sim), lam=float(config.lam))
      io.write_json_atomic(path(u), dict(rows=rows, wall_s=round(time.time() - t1, 2)))
      done += 1
      log(f'chunk {done}/{len(units)} ({u[0]} / {u[1]} from item {u[2]}, {len(rows)} rows; '
          f'{prog.update(done)})')
    parts = {r: [io.read_json(path(u)) for u in units if u[0] == r] for r in world.readers}
    summary = dict(world=config.world, config=config.to_dict(), title=world.title,
                   describe=world.describe(),
                   n_items={d: len(x) for d, x in world.items.items()},
                   readers={r: ts.summarize([x for p in ps for x in p['rows']],
                                            tau_sim=float(config.tau_sim),
                                            seed=int(config.bootstrap_seed))
                            for r, ps in parts.items()},
                   reader_wall_s={r: round(sum(p['wall_s'] for p in ps), 1)
                                  for r, ps in parts.items()},
                   wall_s_this_run=round(time.time() - t0, 1))
    if hasattr(world, 'probes'):  # World A: trained readers' answer probe, accuracy / consistency
      summary['probes'] = world.probes(config)
      summary['reader_stats'] = world.reader_stats(
          [dict(x, reader=r) for r, ps in parts.items() for p in ps for x in p['rows']])
    summary = json.loads(json.dumps(summary))
    _write_outputs(config, workdir, parts, summary)
  return summary


def _csv(path: str, rows: Sequence[dict]) -> None:
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(ROW_COLUMNS), extrasaction='ignore')
  w.writeheader()
  for x in rows:
    w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in x.items()})
  io.write_text_atomic(path, buf.getvalue())


def _panels(readers: dict) -> dict:
  """Readers grouped into plot panels: trained 'family/regime' readers by family, the
  others (oracles, a pretrained reader) together."""
  panels: dict = {}
  for r in readers:
    family, _, regime = r.partition('/')
    panels.setdefault(family if regime else 'readers', []).append((regime or r, r))
  return dict(sorted(panels.items(), key=lambda kv: kv[0] != 'readers'))  # untrained first


def rho_by_length_figure(readers: dict, stem: str) -> list[str]:
  """ρ (95% CI) against trace length: one panel per family (oracles together), colour =
  reader / regime, line style = domain, points nudged apart so the CIs do not overlap."""
  panels = _panels(readers)
  domains = list(dict.fromkeys(d for s in readers.values() for d in s['by_domain_len']))
  styles = ('-', '--', ':', '-.')
  fig = Figure(figsize=(max(3.4 * len(panels), 5.0), 3.9))
  axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
  for ax, (title, members) in zip(axes, panels.items()):
    n_lines = len(members) * len(domains)
    for i, (label, r) in enumerate(members):
      for j, d in enumerate(domains):
        cells = readers[r]['by_domain_len'].get(d, {})
        pts = sorted((int(L), c['rho']) for L, c in cells.items()
                     if c['rho']['value'] is not None)
        if not pts:
          continue
        nudge = 0.05 * ((i * len(domains) + j) - (n_lines - 1) / 2)
        ys = [p[1]['value'] for p in pts]
        ax.errorbar([p[0] + nudge for p in pts], ys,
                    yerr=[[y - p[1]['ci_low'] for y, p in zip(ys, pts)],
                          [p[1]['ci_high'] - y for y, p in zip(ys, pts)]],
                    color=f'C{i}', linestyle=styles[j % len(styles)], marker='o', ms=3.5,
                    capsize=2, lw=1.2, label=f'{label} / {d}' if len(domains) > 1 else label)
    ax.set_title(title, fontsize=9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel('trace length (steps)')
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
      ax.legend(fontsize=6, loc='upper center', bbox_to_anchor=(0.5, -0.2), ncol=2,
                frameon=False)
    else:
      ax.text(0.5, 0.5, 'no parsed trace', ha='center', transform=ax.transAxes)
  axes[0].set_ylabel('violation density ρ')
  fig.suptitle('ρ by trace length (95% CI; colour: reader, line: domain)', fontsize=9)
  fig.tight_layout()
  return plotting.save_figure(fig, stem)


def _write_outputs(config, workdir: str, parts: dict, summary: dict) -> None:
  rows = [dict(x, reader=r) for r, ps in parts.items() for p in ps for x in p['rows']]
  _csv(os.path.join(workdir, 'rows.csv'), rows)
  md = [f"# Trace sensitivity ({summary['title']})", '', summary['describe'], '',
        f"τ_sim = {config.tau_sim}, λ = {config.lam}; φ = 1 − S(a, a*), "
        'ρ = mean 1[S > τ_sim ∧ Strength > λ] over interventions of known strength; '
        '95% percentile-bootstrap CIs resampling items (seed '
        f'{config.bootstrap_seed}). Offline there is no LLM judge: S is exact match '
        '(tokens) or SQuAD token F1 (text).']
  if 'reader_stats' in summary:
    md += ['', '## Overview (World A)', '', overview_table(summary)]
  if summary.get('probes'):
    md += ['', '## §8.4 companion: answer-position probe with the trace held fixed', '',
           'D− = the first hop re-bound ((x_0, k_1) IS a_1: the gold trace would now lead '
           'to v\'_1 ≠ v), the answer (gold trace, v) teacher-forced from D+, so following '
           'the forced trace still gives v. ΔL = log p(v | D+, trace) − log p(v | D−, trace): '
           'the effect of the context on the answer that bypasses the trace. CEU_answer = '
           'restoration by patching the read port at the answer position only (non-degenerate '
           'items, ΔL ≥ ε).', '', probe_table(summary['probes'])]
  for r, s in summary['readers'].items():
    md += ['', f'## {r}', '', f"items: {s['n_items']}, parse failures: {s['n_parse_failure']} "
           f"(rate {s['parse_failure_rate']:.3f}); reader wall time "
           f"{summary['reader_wall_s'][r]:.0f} s", '', ts.table(s), '', '### By trace length', '',
           ts.by_length_table(s), '', '### By intervention position k', '', _k_table(s)]
  if config.plots:
    rho_by_length_figure(summary['readers'], os.path.join(workdir, 'rho_by_length'))
    md += ['', '![ρ by trace length](rho_by_length.png)']
  io.write_json_atomic(os.path.join(workdir, 'summary.json'), summary)
  io.write_text_atomic(os.path.join(workdir, 'report.md'), '\n'.join(md) + '\n')


def overview_table(summary: dict) -> str:
  """Reader × group: answer accuracy, own-trace consistency, φ / ρ overall and by trace length."""
  lens = sorted({L for s in summary['readers'].values() for d in s['by_domain_len'].values()
                 for L in d}, key=int)
  cols = (['reader', 'group', 'parsed items', 'parse fail', 'answer = gold', 'answer = own trace',
           'φ [95% CI]', 'ρ [95% CI]'] + [f'ρ, {L} steps' for L in lens])
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
  empty = {'phi': None, 'rho': None}
  for r, s in summary['readers'].items():
    st = summary['reader_stats'].get(r, {})
    fails = s['parse_failure_by_domain']
    for g in sorted(set(s['by_domain']) | set(st) | set(fails)):
      c = s['by_domain'].get(g, empty)
      n = st.get(g, {}).get('n', 0)
      acc = (lambda k: f"{st[g][k] / n:.3f}" if n else '—')
      by_len = s['by_domain_len'].get(g, {})
      lines.append(f"| {r} | {g} | {n} | {fails.get(g, 0)} | {acc('answer_gold')} | "
                   f"{acc('own_trace')} | "
                   f"{ts.fmt(c['phi'])} | {ts.fmt(c['rho'])} |"
                   + ''.join(f" {ts.fmt(by_len[L]['rho']) if L in by_len else '—'} |" for L in lens))
  return '\n'.join(lines)


def probe_table(probes: dict) -> str:
  """Markdown table of the answer-position probes (pooled and per chain length h)."""
  lines = ['| reader | h | n | ΔL (nats) [95% CI] | CEU_answer [95% CI] (n) | degenerate |',
           '|---|---|---:|---|---|---:|']
  for r, p in probes.items():
    for h, c in [('all', p)] + sorted(p['by_hops'].items()):
      lines.append(f"| {r} | {h} | {c['n']} | {ts.fmt(c['delta_L'])} | "
                   f"{ts.fmt(c['ceu_answer'])} ({c['ceu_answer']['n']}) | {c['n_degenerate']} |")
  return '\n'.join(lines)


def _k_table(s: dict) -> str:
  lines = ['| k | n | φ [95% CI] | ρ [95% CI] |', '|---:|---:|---|---|']
  for k, c in s['by_k'].items():
    lines.append(f"| {k} | {c['n']} | {ts.fmt(c['phi'])} | {ts.fmt(c['rho'])} |")
  return '\n'.join(lines)
