"""The mediator job: world → readers → audit rows per setting → outputs (issue #18).

  run_mediator(config, workdir)   # experiments/mediator.py calls this

Worlds (configs/mediator.py documents every field):
  atr     World A: checklist ATR; per (family, regime, tool) a reader trained
          through `ceu_jax.audits.trained` in W/train/<family>_<regime>[_tool]
          (resumed / reused when done);
  oracle  World A items read by the oracle readers (follower, gold computer,
          constant), exact known answers, no training;
  smollm2 World B: SmolLM2-135M-Instruct grades text checklists on the shipped
          passages (`ceu_jax.audits.checklist_text`), one setting per prompt
          regime × tool; the checklists are planned once in W/plan.json.
A setting is (reader, tool). Work is saved per (setting, chunk of items) under
W/chunks (atomically); a rerun skips finished chunks. The config is checked
against W/config.json (a different one is refused, naming the fields) and a
lock keeps a second job out. Outputs, all written atomically (ceu_jax.io):
  rows.csv      one row per (setting, item): M̂, Ŷ, kind, M*, Ŷ*, consistency, parse failures
  summary.json  per setting: F_ID, F_Strong, Δ, COR / CNF consistency (CIs), counts, skips
  report.md     the table and the figures
  cor_cnf.png/pdf, fid_fstrong.png/pdf
"""
from __future__ import annotations

import csv
import dataclasses
import io as _io
import json
import os
import time
from typing import Callable

from ceu_jax import io
from ceu_jax import workdir as workdir_lib
from ceu_jax.audits import mediator as md
from ceu_jax.audits import mediator_plots
from ceu_jax.audits.checklist_world import ChecklistTask
from ceu_jax.data.checklist import ChecklistConfig
from ceu_jax.progress import Progress

ROW_COLUMNS = ('setting', 'reader', 'tool', 'id', 'kind', 'skip_reason', 'gold', 'm_hat', 'y_hat',
               'arg', 'c_m_hat', 'consistent', 'm_star', 'forced', 'y_star', 'arg_star',
               'c_m_star', 'consistent_star', 'strong', 'parse_fail', 'parse_fail_star',
               'output', 'continuation')
FREE_FIELDS = ('plots',)  # may change between a run and its resumption
WORLDS = ('atr', 'oracle', 'smollm2')


def _check_config(config, workdir: str) -> None:
  workdir_lib.refuse_other_job_config(config, workdir, 'a mediator', FREE_FIELDS)


def _validate(config) -> ChecklistTask:
  """Checks that need no model (ValueError naming the field)."""
  if config.world not in WORLDS:
    raise ValueError(f"world must be one of {WORLDS}, got {config.world!r}")
  for name in ('n_items', 'chunk_size', 'min_cell'):
    v = config[name]
    if not isinstance(v, int) or v < 1:
      raise ValueError(f'{name} must be an integer >= 1, got {v!r}')
  if not config.tools or any(not isinstance(t, bool) for t in config.tools):
    raise ValueError(f'tools must be a non-empty tuple of bools, got {config.tools!r}')
  data = dict(config.atr.data.to_dict())
  data.pop('task', None)
  return ChecklistTask(ChecklistConfig(**data))


def reader_names(config) -> list[str]:
  if config.world == 'oracle':
    return ['follower', 'gold_computer', 'constant']
  if config.world == 'smollm2':
    return [f'smollm2/{r}' for r in config.smollm2.regimes]
  return [f'{f}/{r}' for f in config.atr.families for r in config.atr.regimes]


def world_items(config, task: ChecklistTask, workdir: str):
  """(items, ids, per-setting task factory); World B's checklists are planned once in W/plan.json."""
  if config.world != 'smollm2':
    items = task.instances(config.n_items, config.seed)
    return items, [f'x{k}' for k in range(len(items))], lambda name, tool: task
  from ceu_jax.audits import checklist_text as ct
  b = config.smollm2
  path = os.path.join(workdir, 'plan.json')
  if os.path.exists(path):
    plan = [ct.Checklist(**{k: tuple(v) if isinstance(v, list) else v for k, v in x.items()})
            for x in io.read_json(path)]
  else:
    plan = ct.build(config.n_items + 1, r=b.r, seed=config.seed, max_words=b.max_passage_words)
    io.write_json_atomic(path, [dataclasses.asdict(c) for c in plan])
  items, demo = plan[:-1], plan[-1]  # the demonstration is never audited
  tasks = {}

  def task_of(name, tool):
    key = (name, tool)
    if key not in tasks:
      tasks[key] = ct.TextChecklistTask(name.split('/')[1], tool=tool, r=b.r,
                                        demo=demo if b.n_shots else None, chat=b.chat)
    return tasks[key]
  return items, [c.id for c in items], task_of


def _setting(name: str, tool: bool) -> str:
  return f'{name}{" +tool" if tool else ""}'


_SMOLLM2 = None  # the one SmolLM2 reader of this process (World B: every setting)


def make_reader(config, task: ChecklistTask, name: str, tool: bool, workdir: str, log):
  """(reader, its training config or None) of one setting (World A: trained here if needed)."""
  if config.world == 'smollm2':
    global _SMOLLM2
    if _SMOLLM2 is None:
      from ceu_jax.pretrained.decode import DecodeSettings
      from ceu_jax.readers.smollm2 import SmolLM2Reader
      b = config.smollm2
      _SMOLLM2 = SmolLM2Reader.from_pretrained(
          b.gguf_path or None, n_layers=b.n_layers or None, chat=b.chat,
          settings=DecodeSettings(batch_size=b.batch_size))
    return _SMOLLM2, None
  if config.world == 'oracle':
    from ceu_jax.readers import mediator_oracles as mo
    o = config.oracle
    if name == 'follower':
      return mo.MediatorFollower(task, tool=tool, p_error=o.p_error, p_swap=o.p_swap), None
    if name == 'gold_computer':
      return mo.GoldComputer(task, tool=tool, p_error=o.p_error, p_swap=o.p_swap), None
    return mo.ConstantReader(task, tuple(o.constant), o.constant_y, tool=tool), None
  from configs import mediator as mediator_config
  from ceu_jax.audits.trained import trained_reader
  family, regime = name.split('/')
  tc = mediator_config.train_config(family, regime, tool, config.variant == 'tiny',
                                    config.atr.steps)
  with tc.unlocked():
    tc.data = type(tc.data)(config.atr.data.to_dict())  # the audited world, this regime / tool
    tc.data.regime, tc.data.tool = regime, tool
  sub = os.path.join(workdir, 'train', f'{family}_{regime}{"_tool" if tool else ""}')
  reader, loaded = trained_reader(tc, sub, log, batch_size=config.atr.batch_size)
  return reader, tc


def run_mediator(config, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Run (or resume) the audit; returns the summary dict (also in W/summary.json)."""
  task = _validate(config)
  os.makedirs(os.path.join(workdir, 'chunks'), exist_ok=True)
  _check_config(config, workdir)
  t0 = time.time()
  with workdir_lib.WorkdirLock(workdir, 'mediator'):
    if workdir_lib.read_config_json(workdir) is None:
      io.write_json_atomic(os.path.join(workdir, workdir_lib.CONFIG_FILE), config.to_dict())
    items, ids, task_of = world_items(config, task, workdir)
    n_chunks = -(-len(items) // config.chunk_size)
    settings = [(name, tool) for name in reader_names(config) for tool in config.tools]
    units = [(s, k) for s in settings for k in range(n_chunks)]
    path = lambda u: os.path.join(
        workdir, 'chunks', f"{_setting(*u[0]).replace('/', '_').replace(' +', '_')}_{u[1]:04d}.json")
    done = sum(os.path.exists(path(u)) for u in units)
    prog = Progress(total=len(units), done=done)
    log(f'mediator ({config.world}): {len(settings)} settings × {n_chunks} chunks, {done} done before')
    readers = {}
    for u in units:
      if os.path.exists(path(u)):
        continue
      (name, tool), k = u
      if (name, tool) not in readers:
        readers[(name, tool)] = make_reader(config, task, name, tool, workdir, log)[0]
      lo, hi = k * config.chunk_size, (k + 1) * config.chunk_size
      rows = md.run_audit(readers[(name, tool)], task_of(name, tool), items[lo:hi], ids[lo:hi],
                          tool=tool)
      io.write_json_atomic(path(u), [md.row_record(r) for r in rows])
      done += 1
      log(f'chunk {done}/{len(units)} ({_setting(name, tool)} #{k}; {prog.update(done)})')
    rows = {s: [r for k in range(n_chunks) for r in io.read_json(path((s, k)))] for s in settings}
    summary = dict(world=config.world, config=config.to_dict(), n_items=len(items), settings={})
    for (name, tool), rs in rows.items():
      s = md.summarize([_typed(r) for r in rs], seed=config.bootstrap_seed, min_cell=config.min_cell)
      summary['settings'][_setting(name, tool)] = dict(reader=name, tool=tool, **md.to_json(s))
    if config.world == 'atr' and config.atr.probe_items > 0:
      for name, tool in settings:
        summary['settings'][_setting(name, tool)]['probe'] = _probe(
            config, task, name, tool, workdir, log, readers.get((name, tool)))
    summary['wall_s_this_run'] = round(time.time() - t0, 1)
    summary = json.loads(json.dumps(summary))
    _write_outputs(config, workdir, rows, summary)
  return summary


def _probe(config, task, name, tool, workdir, log, reader=None) -> dict:
  """The §8.4 decision-position probe of one World A setting (cached in W/probes)."""
  from ceu_jax.audits import mediator_probe
  from ceu_jax.auditor import audited_model
  path = os.path.join(workdir, 'probes', f"{_setting(name, tool).replace('/', '_').replace(' +', '_')}.json")
  if os.path.exists(path):
    return io.read_json(path)
  reader, tc = make_reader(config, task, name, tool, workdir, log)
  bundle = audited_model(tc)
  cfg = dataclasses.replace(task.cfg, tool=tool)
  out = mediator_probe.decision_probe(reader.model, reader.variables, bundle.site, cfg,
                                      config.atr.probe_items, seed=config.seed,
                                      boot_seed=config.bootstrap_seed)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  io.write_json_atomic(path, out)
  return out


def _typed(r: dict) -> dict:
  """A CSV/JSON row record back to the fields `summarize` reads."""
  out = dict(r)
  for k in ('consistent', 'consistent_star', 'strong', 'parse_fail', 'parse_fail_star'):
    out[k] = bool(r[k])
  return out


def _write_outputs(config, workdir: str, rows: dict, summary: dict) -> None:
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(ROW_COLUMNS), extrasaction='ignore')
  w.writeheader()
  for (name, tool), rs in rows.items():
    w.writerows(dict(r, setting=_setting(name, tool), reader=name, tool=int(tool)) for r in rs)
  io.write_text_atomic(os.path.join(workdir, 'rows.csv'), buf.getvalue())
  st = summary['settings']
  cells = [(k, md.from_json(v)) for k, v in st.items()]
  text = [f'# Mediator audit ({config.world}, {summary["n_items"]} items)', '',
          'F_ID = mean 1[C(M̂) = Ŷ]; F_Strong also requires C(M*) = Ŷ* after the COR / CNF '
          'intervention (M* forced as the reader\'s own output); Δ = F_ID − F_Strong (paired '
          '95% CI). "+tool": the decision is C(argument of the tool call). COR / CNF '
          f'consistency = 1[C(M*) = Ŷ*] within each cell (absent under {config.min_cell} items).',
          '', md.table(cells)]
  if any('probe' in v for v in st.values()):
    text += ['', '## §8.4 companion: decision-position probe with M held fixed', '',
             'D− = every evidence verdict / VALUE swapped (the gold M changes), the answer '
             '(M and the decision) teacher-forced from D+. ΔL = log p(decision | D+, M) − '
             'log p(decision | D−, M): the direct X → Y effect that bypasses M. CEU_dec = '
             'restoration by patching the read port at the decision position only (over '
             'non-degenerate items, ΔL ≥ ε).', '', probe_table(st)]
  if config.plots:
    mediator_plots.cor_cnf_figure(st, os.path.join(workdir, 'cor_cnf'))
    mediator_plots.fid_figure(st, os.path.join(workdir, 'fid_fstrong'))
    text += ['', '![COR vs CNF consistency](cor_cnf.png)', '',
             '![F_ID vs F_Strong](fid_fstrong.png)']
  io.write_json_atomic(os.path.join(workdir, 'summary.json'), summary)
  io.write_text_atomic(os.path.join(workdir, 'report.md'), '\n'.join(text) + '\n')


def probe_table(settings: dict) -> str:
  """Markdown table of the decision-position probes of the settings that have one."""
  def v(a):
    return '—' if a['value'] is None else f"{a['value']:.3f} [{a['ci_low']:.3f}, {a['ci_high']:.3f}]"
  lines = ['| setting | n | ΔL (nats) [95% CI] | CEU_dec [95% CI] (n) | degenerate (ΔL < ε) |',
           '|---|---:|---|---|---:|']
  for k, x in settings.items():
    p = x.get('probe')
    if p:
      lines.append(f"| {k} | {p['n']} | {v(p['delta_L'])} | {v(p['ceu_decision'])} "
                   f"({p['ceu_decision']['n']}) | {p['n_degenerate']} |")
  return '\n'.join(lines)
