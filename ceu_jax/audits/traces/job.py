"""The trace-sensitivity job: world → items per domain → audit rows → outputs (issue #17).

  run_trace_sensitivity(config, workdir)   # experiments/trace_sensitivity.py calls this

Worlds (config.world; configs/trace_sensitivity.py documents every field;
`ceu_jax.audits.traces.worlds.make_world`): chain (World A, trace oracles and
trained chain readers) and smollm2 (World B).

A unit is one chunk of items of one domain read by one reader; the job runs on
the one job contract (`ceu_jax.jobs.run_job`: the workdir lock, the config check
against W/job.json, W/units/ resumed, atomic outputs, progress). Outputs:
  rows.csv       one row per (reader, item, k, τ) and one per unparseable item
  summary.json   per reader: parse failures, identity check, φ / ρ / follow rate
                 overall and by domain, τ, k, trace length, domain × τ (bootstrap CIs),
                 regeneration parse failures, undefined interventions and Strength
                 unknown by reason; the τ each domain defines; `claims`: the headline
                 decided by rule (`verdicts`: follow rate > 0.5 per reader; 002's
                 ρ(arithmetic) < ρ(factual) where a reader did both); `competence`
                 (World B with fine-tuned readers): each reader's competence check on
                 held-out problems — a reader that is not competent has untested claims
  report.md      the φ / ρ / follow table by domain × τ, by trace length, by k, the plot
  rho_by_length.png/pdf   ρ against trace length (one line per reader × domain)
  probe_layers.png/pdf    (World B with fine-tuned readers) the §8.4 answer-position probe's
                 CEU by layer per reader (`smollm2_probe`; per-item numbers in W/probes/)
"""
from __future__ import annotations

import csv
import dataclasses
import io as _io
import json
import time
from typing import Callable, Sequence


from ceu_jax import claims, jobs, plotting
from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import summary as tsum
from ceu_jax.audits.traces import verdicts, worlds

ROW_COLUMNS = ('reader', 'domain', 'id', 'trace_len', 'k', 'tau', 'parsed', 'parse_failure',
               'applied', 'undefined', 'answer', 'answer_after', 'regen_parsed', 'regen_failure',
               'S', 'phi', 'same', 'strength', 'strong', 'strength_unknown', 'violation', 'follows',
               'identical', 'implied_before', 'implied_after', 'implied_trace', 'forced',
               'continuation', 'raw', 'stratum')
FREE_FIELDS = ('plots',)  # may change between a run and its resumption


class TraceSensitivityJob(jobs.Job):
  """The trace audit on the one job contract: a unit is one chunk of items of one
  domain read by one reader (W/units/<reader>_<domain>_<first item>.json)."""
  name = 'trace_sensitivity'
  free_fields = FREE_FIELDS

  def __init__(self, config):
    self.world = worlds.make_world(config)   # validates before anything is built or written
    super().__init__(config)
    self.positions = tuple(config.positions) or None
    self._readers: dict = {}

  def record(self):
    """The config and the version of the audit's rules (`audit.RULES_VERSION`): units
    scored under earlier rules are never resumed with these (refused, naming the field)."""
    return {**jobs.plain(self.config), 'rules_version': ts.RULES_VERSION}

  def prepare(self, ctx):
    self.world.prepare(ctx.workdir, ctx.log)

  def plan(self, ctx):
    cs, items = int(self.config.items_per_chunk), self.world.items
    n_max = max(len(x) for x in items.values())
    return [jobs.Unit(f"{r.replace('/', '_')}_{d}_{lo:05d}", (r, d, lo))
            for r in self.world.readers for lo in range(0, n_max, cs)
            for d in self.world.domains if lo < len(items[d])  # domains interleaved
            and (not hasattr(self.world, 'reads') or self.world.reads(r, d))]

  def run_unit(self, ctx, spec):
    r, d, lo = spec
    if r not in self._readers:
      self._readers[r] = self.world.reader(r)
    c, t1 = self.config, time.time()
    rows = ts.run_traces(self._readers[r], self.world.domains[d],
                         self.world.items[d][lo:lo + int(c.items_per_chunk)],
                         taus=tuple(c.taus),
                         positions=self.positions, tau_sim=float(c.tau_sim), lam=float(c.lam))
    return dict(rows=rows, wall_s=round(time.time() - t1, 2))

  def describe_unit(self, spec, result):
    return f"{len(result['rows'])} rows"

  def _parts(self, results) -> dict:
    """{reader: [unit results]}, each row tagged with its item's stratum where the world
    has strata (World B with memorised problems: `stratum`)."""
    units = self.plan(None)
    stratum = getattr(self.world, 'stratum', None)
    tag = (lambda res: res) if stratum is None else (lambda res: dict(res, rows=[
        dict(x, stratum=stratum(x['domain'], x['id'])) for x in res['rows']]))
    return {r: [tag(results[u.key]) for u in units if u.spec[0] == r] for r in self.world.readers}

  def summarize(self, ctx, results):
    c, world, parts = self.config, self.world, self._parts(results)
    summary = dict(world=c.world, config=c.to_dict(), title=world.title,
                   describe=world.describe(),
                   n_items={d: len(x) for d, x in world.items.items()},
                   taus_defined={d: list(x.taus) for d, x in world.domains.items()},
                   readers={r: tsum.summarize([x for p in ps for x in p['rows']],
                                            tau_sim=float(c.tau_sim),
                                            seed=int(c.bootstrap_seed))
                            for r, ps in parts.items()},
                   reader_wall_s={r: round(sum(p['wall_s'] for p in ps), 1)
                                  for r, ps in parts.items()})
    rows = {r: [x for p in ps for x in p['rows']] for r, ps in parts.items()}
    if hasattr(world, 'probes'):  # §8.4: the answer-position probe with the trace held fixed
      summary['probes'] = world.probes(c)
    competence = world.competence() if hasattr(world, 'competence') else {}
    if competence:   # World B with fine-tuned readers: the competence check before the audit
      summary['competence'] = competence
    found = verdicts.decide(summary['readers'], rows,   # World B: does the probe separate too
                            summary.get('probes') if c.world == 'smollm2' else None,
                            competence, seed=int(c.bootstrap_seed))
    summary['claims'] = [dataclasses.asdict(x) for x in found]
    if hasattr(world, 'reader_stats'):  # World A: accuracy / consistency per reader
      summary['reader_stats'] = world.reader_stats(
          [dict(x, reader=r) for r, ps in parts.items() for p in ps for x in p['rows']])
    return summary

  def write(self, ctx, results, summary):
    _write_outputs(self.config, ctx, self._parts(results), summary)


def run_trace_sensitivity(config, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Run (or resume) the audit; returns the summary dict (also in W/summary.json)."""
  return jobs.run_job(TraceSensitivityJob(config), workdir, log=log)


def _csv(rows: Sequence[dict]) -> str:
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(ROW_COLUMNS), extrasaction='ignore')
  w.writeheader()
  for x in rows:
    w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in x.items()})
  return buf.getvalue()


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
  fig = plotting.figure(figsize=(max(3.4 * len(panels), 5.0), 3.9))
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
    from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
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


def _write_outputs(config, ctx: jobs.JobContext, parts: dict, summary: dict) -> None:
  rows = [dict(x, reader=r) for r, ps in parts.items() for p in ps for x in p['rows']]
  ctx.write_text('rows.csv', _csv(rows))
  md = [f"# Trace sensitivity ({summary['title']})", '', summary['describe'], '',
        f"τ_sim = {config.tau_sim}, λ = {config.lam}; φ = 1 − S(a, a*), "
        'ρ = mean 1[S ≥ τ_sim ∧ Strength > λ] over interventions of known strength (S ≥ τ_sim: '
        'SPEC §8.2\'s offline rule, compared exactly, S as a fraction); '
        'follow = share of interventions whose a* is the answer the edited trace implies '
        '(where that answer is known; "Strength > λ": only edits that moved it). φ, ρ and '
        'follow are over regenerations that parse; the regeneration parse-failure rate, '
        'the interventions not applied (undefined for the item, by reason) and Strength '
        'unknown (by reason) are columns; "φ / ρ if unparsed = changed" is the former '
        'convention (an unparseable regeneration scored S = 0), kept as a sensitivity '
        'column. 95% percentile-bootstrap CIs resampling items (1000 resamples, seed '
        f'{config.bootstrap_seed}). Offline there is no LLM judge: S is exact match '
        '(tokens) or SQuAD token F1 (text). Interventions each domain defines: '
        + '; '.join(f"{d}: {', '.join(t)}" for d, t in summary['taus_defined'].items()) + '.']
  md += ['', '## Headline, decided by rule', '',
         claims.table([claims.Claim(**x) for x in summary['claims']])]
  if summary.get('competence'):
    md += ['', '## Competence before the audit (held-out problems, no intervention)', '',
           'Greedy traces of held-out arithmetic problems (not trained on, not audited) with '
           'the audit\'s prompt, parse and stop rules; accuracy counts an unparsed output as '
           'wrong; "corrupted step forced": one Strength-1 LogicFlip / FactReversal step per '
           'problem forced, the share of parsed answers equal to the answer the corrupted '
           'trace implies (follow) and to the gold (gold). Each rate: value [95% percentile '
           'bootstrap CI over problems, 1000 resamples, seed 42] (n); the competence gate '
           'compares the point values with the thresholds. '
           + verdicts.COMPETENCE_RULE[0].upper()
           + verdicts.COMPETENCE_RULE[1:] + ' (the [memorised] rows: the problems the '
           'fine-tunes were trained on).', '',
           competence_table(summary['competence'])]
  if 'reader_stats' in summary:
    md += ['', '## Overview (World A)', '', overview_table(summary)]
  if summary.get('probes') and summary['world'] == 'smollm2':
    from ceu_jax.audits.traces import smollm2_probe   # World B only (it reaches training)
    md += ['', '## §8.4 companion: answer-position probe with the trace held fixed', '',
           smollm2_probe.DESCRIPTION, '', smollm2_probe.table(summary['probes'])]
    if config.plots:
      smollm2_probe.layer_figure(summary['probes'], ctx.path('probe_layers'))
      md += ['', '![CEU by layer](probe_layers.png)']
  elif summary.get('probes'):
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
           f"{summary['reader_wall_s'][r]:.0f} s", '', tsum.table(s), '', '### By trace length', '',
           tsum.by_length_table(s), '', '### By τ and trace length', '',
           tsum.tau_length_table(s), '', '### By intervention position k', '',
           tsum.breakdown_table(s['by_k'], 'k')]
    if s.get('by_stratum'):
      md += ['', '### By stratum (memorised: the audit items the fine-tuned readers were '
             'trained on; fresh: never trained on)', '',
             tsum.breakdown_table(s['by_stratum'], 'stratum')]
  if config.plots:
    rho_by_length_figure(summary['readers'], ctx.path('rho_by_length'))
    md += ['', '![ρ by trace length](rho_by_length.png)']
  ctx.write_text('report.md', '\n'.join(md) + '\n')


def overview_table(summary: dict) -> str:
  """Reader × group: answer accuracy, own-trace consistency, φ / ρ / follow overall, ρ by
  trace length."""
  lens = sorted({L for s in summary['readers'].values() for d in s['by_domain_len'].values()
                 for L in d}, key=int)
  cols = (['reader', 'group', 'parsed items', 'parse fail', 'answer = gold', 'answer = own trace',
           'regen parse fail', 'φ [95% CI]', 'ρ [95% CI]', 'follow [95% CI]',
           'follow, Strength > λ'] + [f'ρ, {L} steps' for L in lens])
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
  empty = {'phi': None, 'rho': None, 'follow': None, 'follow_strong': None,
           'regen_parse_failure': None}
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
                   + ('—' if c['regen_parse_failure'] is None else f"{c['regen_parse_failure']:.3f}")
                   + f" | {tsum.fmt(c['phi'])} | {tsum.fmt(c['rho'])} | {tsum.fmt(c['follow'])} | "
                   f"{tsum.fmt(c['follow_strong'])} |"
                   + ''.join(f" {tsum.fmt(by_len[L]['rho']) if L in by_len else '—'} |" for L in lens))
  return '\n'.join(lines)


def competence_table(competence: dict) -> str:
  """Markdown table of the readers' competence checks (held-out problems; with memorised
  problems a second row per reader on them: competence is decided on held-out ones). Every
  rate: value [95% CI] (n) (`summary.fmt_rate`; '(no CI)' for a check made before CIs)."""
  f = tsum.fmt_rate
  lines = ['| reader | competent | n | answer accuracy | parse rate | own trace | corrupted n | '
           'follow | gold | corrupted parse | wall (s) |', '|---|---|---:|---|---|---|---:|---|---|---|---:|']
  for r, c in competence.items():
    k = c['corrupted']
    lines.append(f"| {r} | {'yes' if c['competent'] else '**no**'} | {c['n']} | "
                 f"{f(c, 'accuracy')} (≥ {c['min_accuracy']}) | {f(c, 'parse_rate')} "
                 f"(≥ {c['min_parse_rate']}) | {f(c, 'own_trace')} | {k['n']} | "
                 f"{f(k, 'follow')} | {f(k, 'gold')} | {f(k, 'parse_rate')} | {c['wall_s']:.0f} |")
    if 'memorised' in c:
      m = c['memorised']
      k = m['corrupted']
      lines.append(f"| {r} [memorised] | — | {m['n']} | {f(m, 'accuracy')} | "
                   f"{f(m, 'parse_rate')} | {f(m, 'own_trace')} | {k['n']} | {f(k, 'follow')} | "
                   f"{f(k, 'gold')} | {f(k, 'parse_rate')} | {m['wall_s']:.0f} |")
  return '\n'.join(lines)


def probe_table(probes: dict) -> str:
  """Markdown table of the answer-position probes (pooled and per chain length h)."""
  lines = ['| reader | h | n | ΔL (nats) [95% CI] | CEU_answer [95% CI] (n) | degenerate |',
           '|---|---|---:|---|---|---:|']
  for r, p in probes.items():
    for h, c in [('all', p)] + sorted(p['by_hops'].items()):
      lines.append(f"| {r} | {h} | {c['n']} | {tsum.fmt(c['delta_L'])} | "
                   f"{tsum.fmt(c['ceu_answer'])} ({c['ceu_answer']['n']}) | {c['n_degenerate']} |")
  return '\n'.join(lines)
