"""The mediator job: world → readers → audit rows per setting → outputs (issue #18).

  run_mediator(config, workdir)   # experiments/mediator.py calls this

Worlds (configs/mediator.py documents every field; `ceu_jax.audits.mediator.worlds`):
atr (World A, trained checklist readers), oracle (oracle readers), smollm2 (World B).
A setting is (reader, tool); a unit is one chunk of items in one setting. The job
runs on the one job contract (`ceu_jax.jobs.run_job`: the workdir lock, the config
check against W/job.json, W/units/ resumed, atomic outputs, progress). Outputs:
  rows.csv      one row per (setting, item): M̂, Ŷ, kind, M*, Ŷ*, consistency, parse failures
                and their reasons, stop reasons, the raw output and continuation
  summary.json  per setting: F_ID, F_Strong, Δ, COR / CNF consistency (CIs), counts, skips;
                `claims`: the headline decided by rule (`verdicts`: 003's gap, asymmetry and
                tool residual per setting; shortcut vs faithful reader, paired)
  report.md     the table and the figures
  cor_cnf.png/pdf, fid_fstrong.png/pdf
  probe_layers.png/pdf  (World B with fine-tuned readers) the §8.4 decision-position probe's
                CEU by layer per setting (`smollm2_probe`; per-item numbers in W/probes/)
"""
from __future__ import annotations

import csv
import dataclasses
import io as _io
from typing import Callable

from ceu_jax import claims, jobs
from ceu_jax.audits.mediator import audit as md
from ceu_jax.audits.mediator import plots as mediator_plots
from ceu_jax.audits.mediator import verdicts, worlds
from ceu_jax.metrics.resampling import fmt_ci

ROW_COLUMNS = ('setting', 'reader', 'tool', 'id', 'kind', 'skip_reason', 'gold', 'm_hat', 'y_hat',
               'arg', 'c_m_hat', 'consistent', 'm_star', 'forced', 'y_star', 'arg_star',
               'c_m_star', 'consistent_star', 'strong', 'parse_fail', 'parse_fail_star',
               'fail_reason', 'fail_reason_star', 'stop_reason', 'stop_reason_star', 'arg_copy',
               'arg_copy_star', 'consistent_own', 'consistent_star_own', 'strong_own', 'output',
               'continuation')
FREE_FIELDS = ('plots',   # may change between a run and its resumption:
               'smollm2.probe_names')  # the §8.4 probe's pairs (cached apart), never a unit


ADDED_FIELDS = {       # fields added after runs were recorded: the value those runs ran as
    'smollm2.tool_init': 'fresh',                 # (2026-11-29) tool readers' fresh adapters
    'smollm2.tool_init_steps': jobs.ANY_VALUE,    # only read under tool_init = no_tool
    'smollm2.train.data.max_len_tool': jobs.ANY_VALUE,  # tool readers' rows (a tool fine-tune
                                                  # recorded without it refuses on its own)
    'smollm2.train.data.restate_arg': False}      # (2026-11-30) tool arguments without names


class MediatorJob(jobs.Job):
  """The mediator audit on the one job contract: a unit is one chunk of items read
  in one setting (reader, tool): W/units/<setting>_<k>.json."""
  name = 'mediator'
  free_fields = FREE_FIELDS
  added_fields = ADDED_FIELDS

  def __init__(self, config):
    self.world = worlds.make_world(config)   # validates before anything is built or written
    super().__init__(config)
    self.settings = [(name, tool) for name in self.world.readers for tool in config.tools]

  def record(self):
    """The config, and in World A with the tool the version of its forced prefix
    (`checklist_world.TOOL_PREFIX_VERSION`: it ends at the TOOL cue since 600df61): units
    forced the earlier way are never resumed with this one (refused, naming the field)."""
    rec = jobs.plain(self.config)
    if self.config.world in ('atr', 'oracle') and True in tuple(self.config.tools):
      from ceu_jax.audits.mediator import checklist_world  # pylint: disable=g-import-not-at-top
      rec['tool_prefix_version'] = checklist_world.TOOL_PREFIX_VERSION
    return rec

  def prepare(self, ctx):
    self.world.prepare(ctx.workdir, ctx.log)
    self.n_chunks = -(-len(self.world.items) // self.config.items_per_chunk)

  def plan(self, ctx):
    return [jobs.Unit(f'{worlds.setting_key(*s)}_{k:04d}', (s, k)) for s in self.settings
            for k in range(self.n_chunks)]

  def run_unit(self, ctx, spec):
    (name, tool), k = spec
    w, cs = self.world, self.config.items_per_chunk
    rows = md.run_audit(w.reader(name, tool), w.task(name, tool), w.items[k * cs:(k + 1) * cs],
                        w.ids[k * cs:(k + 1) * cs], tool=tool)
    return [md.row_record(r) for r in rows]

  def _rows(self, results) -> dict:
    return {s: [r for k in range(self.n_chunks) for r in results[f'{worlds.setting_key(*s)}_{k:04d}']]
            for s in self.settings}

  def summarize(self, ctx, results):
    c = self.config
    summary = dict(world=c.world, config=c.to_dict(), n_items=len(self.world.items), settings={})
    for (name, tool), rs in self._rows(results).items():
      s = md.summarize([_typed(r) for r in rs], seed=c.bootstrap_seed, min_cell=c.min_cell)
      summary['settings'][worlds.setting(name, tool)] = dict(reader=name, tool=tool,
                                                             **md.to_json(s))
    if c.world == 'atr' and c.atr.probe_items > 0:
      for name, tool in self.settings:
        summary['settings'][worlds.setting(name, tool)]['probe'] = self.world.probe(name, tool)
    rows = {worlds.setting(*s): rs for s, rs in self._rows(results).items()}
    probes = self.world.probes() if hasattr(self.world, 'probes') else {}
    if probes:   # World B: the §8.4 decision-position probe per setting
      summary['probes'] = probes
    competence = self.world.competence() if hasattr(self.world, 'competence') else {}
    if competence:   # World B's fine-tuned readers: the competence check before the audit
      summary['competence'] = competence
    found = decide(c, summary['settings'], rows, self.world.readers, probes, competence)
    summary['claims'] = [dataclasses.asdict(x) for x in found]
    return summary

  def write(self, ctx, results, summary):
    _write_outputs(self.config, ctx, self._rows(results), summary)


def run_mediator(config, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Run (or resume) the audit; returns the summary dict (also in W/summary.json)."""
  return jobs.run_job(MediatorJob(config), workdir, log=log)


def unit_rows(workdir: str, settings: dict) -> dict:
  """{setting: its audit rows} read back from a run's unit files (every chunk, in order)."""
  import glob
  import json
  import os
  out = {}
  for k, v in settings.items():
    key = worlds.setting_key(v['reader'], v['tool'])
    files = sorted(glob.glob(os.path.join(workdir, jobs.UNITS_DIR,
                                          f'{key}_[0-9][0-9][0-9][0-9].json')))
    out[k] = [r for f in files for r in json.load(open(f))]
  return out


def decide(config, settings: dict, rows: dict, readers, probes: dict,
           competence: dict) -> list:
  """The job's claims, by rule, from its per-setting summaries and rows, the §8.4 probes
  (World B) and the competence checks (World B's fine-tuned readers: a claim naming a
  reader that is not competent is untested). The job and the recorded-run tests call it."""
  c = config
  pairs = verdicts.contrasts(readers, c.tools)
  found = verdicts.run_claims(settings, rows, pairs, seed=c.bootstrap_seed, min_cell=c.min_cell)
  if probes:
    from ceu_jax.audits import layer_probe
    by_name = {x.name: x for x in found}
    for label, short, faith in pairs:
      if short in probes and faith in probes:
        found += layer_probe.pair_claims(
            label, probes[short], probes[faith], by_name.get(f'{label}: separates'),
            seed=c.bootstrap_seed, statement='the §8.4 probe tells the shortcut reader from '
            'the faithful one: with M held fixed, making a statement true moves the shortcut '
            'reader\'s decision more (ΔL larger on the same checklists)')
  if competence:
    found = verdicts.unless_competent(found, competence, pairs)
  return found


def _typed(r: dict) -> dict:
  """A CSV/JSON row record back to the fields `summarize` reads."""
  out = dict(r)
  for k in ('consistent', 'consistent_star', 'strong', 'parse_fail', 'parse_fail_star',
            'arg_copy', 'arg_copy_star', 'consistent_own', 'consistent_star_own', 'strong_own'):
    out[k] = bool(r.get(k, False))
  return out


def _write_outputs(config, ctx: jobs.JobContext, rows: dict, summary: dict) -> None:
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(ROW_COLUMNS), extrasaction='ignore')
  w.writeheader()
  for (name, tool), rs in rows.items():
    w.writerows(dict(r, setting=worlds.setting(name, tool), reader=name, tool=int(tool))
                for r in rs)
  ctx.write_text('rows.csv', buf.getvalue())
  st = summary['settings']
  cells = [(k, md.from_json(v)) for k, v in st.items()]
  text = [f'# Mediator audit ({config.world}, {summary["n_items"]} items)', '',
          'F_ID = mean 1[C(M̂) = Ŷ]; F_Strong also requires C(M*) = Ŷ* after the COR / CNF '
          'intervention (M* forced as the reader\'s own output); Δ = F_ID − F_Strong (paired '
          '95% CI). "+tool": the decision is C(argument of the tool call). COR / CNF '
          f'consistency = 1[C(M*) = Ŷ*] within each cell (absent under {config.min_cell} items). '
          '"Δ own M̂": the gap when the tool runs on the reader\'s own M̂ (M* after the '
          'intervention) whenever its call parses (003 §6.1), beside Δ with the argument as written.',
          '', md.table(cells), '', '## Headline, decided by rule', '',
          claims.table([claims.Claim(**x) for x in summary['claims']])]
  if summary.get('competence'):
    from ceu_jax.audits.mediator import competence as mc
    text += ['', '## Competence before the audit (held-out checklists)', '',
             'The audit on checklists of passages the fine-tunes never saw (outside this '
             'audit\'s plan): checklist accuracy (M̂ = gold, every line), decision parse rate, '
             'F_ID and the CNF consistency (a changed checklist forced: does the decision '
             'follow it). A setting below the thresholds is reported as not competent and '
             'its claims are untested. ' + mc.TABLE_NOTE, '', mc.table(summary['competence'])]
  if summary.get('probes'):
    from ceu_jax.audits.mediator import smollm2_probe
    names = worlds.probe_names(config)
    text += ['', '## §8.4 companion: decision-position probe with M held fixed (SmolLM2)', '',
             smollm2_probe.DESCRIPTION + ('' if names == 'verbatim' else
                                          smollm2_probe.FOLLOW_NOTE), '',
             smollm2_probe.table(summary['probes'], names)]
    if config.plots:
      smollm2_probe.layer_figure(summary['probes'], ctx.path('probe_layers'), names)
      text += ['', '![CEU by layer](probe_layers.png)']
  if any('probe' in v for v in st.values()):
    text += ['', '## §8.4 companion: decision-position probe with M held fixed', '',
             'D− = every evidence verdict / VALUE swapped (the gold M changes), the answer '
             '(M and the decision) teacher-forced from D+. ΔL = log p(decision | D+, M) − '
             'log p(decision | D−, M): the direct X → Y effect that bypasses M. CEU_dec = '
             'restoration by patching the read port at the decision position only (over '
             'non-degenerate items, ΔL ≥ ε).', '', probe_table(st)]
  if config.plots:
    mediator_plots.cor_cnf_figure(st, ctx.path('cor_cnf'))
    mediator_plots.fid_figure(st, ctx.path('fid_fstrong'))
    text += ['', '![COR vs CNF consistency](cor_cnf.png)', '',
             '![F_ID vs F_Strong](fid_fstrong.png)']
  ctx.write_text('report.md', '\n'.join(text) + '\n')


def probe_table(settings: dict) -> str:
  """Markdown table of the decision-position probes of the settings that have one."""
  lines = ['| setting | n | ΔL (nats) [95% CI] | CEU_dec [95% CI] (n) | degenerate (ΔL < ε) |',
           '|---|---:|---|---|---:|']
  for k, x in settings.items():
    p = x.get('probe')
    if p:
      lines.append(f"| {k} | {p['n']} | {fmt_ci(p['delta_L'])} | {fmt_ci(p['ceu_decision'])} "
                   f"({p['ceu_decision']['n']}) | {p['n_degenerate']} |")
  return '\n'.join(lines)
