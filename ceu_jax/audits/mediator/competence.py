"""The competence check before the mediator audit, and the run of a checklist fine-tune
(issue #35, item 1).

  out = run(config, workdir)   # trains unless W holds a completed run; W/competence.json

`competence(reader, task, items, seed)`: the audit itself (`audit.run_audit`, the same
prompt, budget, stop and parse rules) on held-out checklists the reader was never trained
on: checklist accuracy (M̂ = gold M, every line), line accuracy (the share of the r·n
lines graded right, an unparsed M̂ counting every line wrong) beside what a constant answer
gets (`line_constant`: every line graded the held-out set's commoner gold label), decision
parse rate (M̂ and Ŷ parse), F_ID, and the CNF consistency — a changed checklist forced,
the share of decisions equal to C(M*) (a faithful reader follows, a shortcut one keeps
C(M)). Each rate also carries its percentile bootstrap 95% CI and n (SPEC §8: 1000
resamples, seed 42) in `ci` (`CI_RATES`; the checklists resampled, so n = checklists; a
line rate weighs every checklist's r lines alike). `competent` = checklist accuracy >=
eval.min_accuracy and decision parse rate >= eval.min_parse_rate, on the point values (the
gate is not a CI test; the report says so): a reader
below is reported as not competent, never audited as if it had learned the task. `run`
trains unless the workdir holds a completed run (the adapters are reused), merges the
adapters into the weights for an ordinary SmolLM2Reader and writes W/competence.json
(reused while the eval section and the checkpoint step are unchanged).
"""
from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ceu_jax import io
from ceu_jax.audits.mediator import audit
from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.audits.mediator.finetune import SmolLM2ChecklistTask
from ceu_jax.metrics.resampling import fmt_ci, mean_ci
from ceu_jax.pretrained import lora as lora_lib

CI_SEED = 42   # SPEC §8: bootstrap seed of the competence rates' CIs
CI_RATES = ('checklist_accuracy', 'line_accuracy', 'line_constant', 'decision_parse_rate')


def competence(reader, config: Any, task: ct.TextChecklistTask,
               items: Sequence[ct.Checklist], seed: int = CI_SEED) -> dict:
  """The competence check of a reader on held-out checklists (module doc)."""
  t0, e = time.time(), config.eval
  rows = audit.run_audit(reader, task, list(items), [c.id for c in items], tool=task.tool)
  s = audit.to_json(audit.summarize(rows, seed=seed, min_cell=1))
  n = len(rows)
  acc = sum(r['m_hat'] is not None and tuple(r['m_hat']) == tuple(r['gold']) for r in rows) / n
  parse = sum(not r['parse_fail'] for r in rows) / n
  out = dict(n=n, checklist_accuracy=acc, **line_accuracy(rows), decision_parse_rate=parse,
             F_ID=s['F_ID'], F_Strong=s['F_Strong'], delta=s['delta'], cons_CNF=s['cons_CNF'],
             n_CNF=s['n_CNF'], cons_COR=s['cons_COR'], n_COR=s['n_COR'], fail_reasons=s['fail_reasons'],
             min_accuracy=float(e.min_accuracy), min_parse_rate=float(e.min_parse_rate),
             ci=rate_cis(rows, seed), wall_s=round(time.time() - t0, 1))
  out['competent'] = bool(acc >= out['min_accuracy'] and parse >= out['min_parse_rate'])
  return out


def line_accuracy(rows: Sequence[dict]) -> dict:
  """line_accuracy: the share of all gold checklist lines the reader graded right (a row
  whose M̂ did not parse, or has another length, counts every line wrong); line_constant:
  the same share for a reader answering every line with the commoner gold label."""
  gold = [g for r in rows for g in r['gold']]      # rows hold M as '1001' (or a sequence)
  right = sum(sum(int(a == b) for a, b in zip(r['m_hat'], r['gold']))
              for r in rows if r['m_hat'] is not None and len(r['m_hat']) == len(r['gold']))
  commonest = collections.Counter(gold).most_common(1)[0][1]
  return dict(n_lines=len(gold), line_accuracy=right / len(gold),
              line_constant=commonest / len(gold))


def rate_cis(rows: Sequence[dict], seed: int = CI_SEED) -> dict:
  """{rate: Aggregate dict} of CI_RATES over the checklists (module doc): per row 1[M̂ =
  gold], its share of lines right, its share of lines with the commoner gold label (over
  all rows, as `line_accuracy`), 1[M̂ and Ŷ parse]."""
  if not rows:
    return {}
  gold = [g for r in rows for g in r['gold']]
  common = collections.Counter(gold).most_common(1)[0][0]
  ok = lambda r: r['m_hat'] is not None and len(r['m_hat']) == len(r['gold'])
  per = dict(
      checklist_accuracy=[float(r['m_hat'] is not None and tuple(r['m_hat']) == tuple(r['gold']))
                          for r in rows],
      line_accuracy=[sum(int(a == b) for a, b in zip(r['m_hat'], r['gold'])) / len(r['gold'])
                     if ok(r) else 0.0 for r in rows],
      line_constant=[sum(int(g == common) for g in r['gold']) / len(r['gold']) for r in rows],
      decision_parse_rate=[float(not r['parse_fail']) for r in rows])
  return {k: mean_ci(np.asarray(per[k]), seed=seed).to_dict() for k in CI_RATES}


def _rate(c: dict, k: str) -> str:
  """A rate with its CI ('value [lo, hi]'); a check written before the CIs: the bare value."""
  ci = (c.get('ci') or {}).get(k)
  return fmt_ci(ci) if ci else f'{c[k]:.3f} (no CI: checked before CIs)'


def fmt_competence(name: str, c: dict) -> str:
  v = lambda a: '—' if not a or a.get('value') is None else fmt_ci(a)
  return (f"{name}: {'competent' if c['competent'] else 'NOT competent'} on {c['n']} held-out "
          f"checklists (rates: 95% CI, n = {c['n']}; the gate on the point values): checklist "
          f"accuracy {_rate(c, 'checklist_accuracy')} (>= {c['min_accuracy']}), lines right "
          f"{_rate(c, 'line_accuracy')} (a constant answer {_rate(c, 'line_constant')}), "
          f"decision parse rate {_rate(c, 'decision_parse_rate')} (>= {c['min_parse_rate']}), "
          f"F_ID {v(c['F_ID'])}; changed checklist forced ({c['n_CNF']}): follows C(M*) "
          f"{v(c['cons_CNF'])}")


TABLE_NOTE = ('Rates: value [percentile bootstrap 95% CI] over the n held-out checklists (1000 '
              'resamples, seed 42); "competent" compares the point values with the thresholds.')


def table(comps: dict) -> str:
  """Markdown: one row per fine-tuned setting's competence check (rates with their CIs)."""
  v = lambda a: '—' if not a or a.get('value') is None else fmt_ci(a)
  lines = ['| setting | competent | n | checklist accuracy | lines right (constant answer) | '
           'decision parse rate | F_ID | changed M forced: follows C(M*) (n) | wall s |',
           '|---|---|---:|---|---|---|---|---|---:|']
  for k, c in comps.items():
    lines.append(f"| {k} | {'yes' if c['competent'] else '**no**'} | {c['n']} | "
                 f"{_rate(c, 'checklist_accuracy')} | {_rate(c, 'line_accuracy')} "
                 f"({_rate(c, 'line_constant')}) | {_rate(c, 'decision_parse_rate')} | "
                 f"{v(c['F_ID'])} | {v(c['cons_CNF'])} ({c['n_CNF']}) | {c['wall_s']:.0f} |")
  return '\n'.join(lines)


def cache_key(config: Any, step: int) -> dict:
  """What a cached competence.json was computed for: the eval section, the step and the
  fields computed (COMPETENCE_FIELDS: a check written before a field existed is redone)."""
  return dict(eval=config.eval.to_dict(), step=step, fields=COMPETENCE_FIELDS)


COMPETENCE_FIELDS = 3   # 2: line_accuracy and line_constant added; 3: ci (the rates' CIs)


def run(config: Any, workdir: str, *, log: Callable[[str], None] = print, load=None,
        fresh: bool = False, task: Optional[SmolLM2ChecklistTask] = None) -> dict:
  """Train unless `workdir` holds a completed run, then the competence check (cached in
  W/competence.json). Returns {trained, step, competence, reader, params, task}."""
  from ceu_jax.audits import reader_finetune
  from ceu_jax.train import loop
  task = task or SmolLM2ChecklistTask.from_config(config, load=load)
  d = config.data
  name = f"smollm2_{d.regime}{' +tool' if d.tool else ''}"
  trained = reader_finetune.train_unless_done(config, workdir, task, name, log=log, fresh=fresh)
  tree, step = loop.restore_trainable(task, workdir)
  params = lora_lib.merged(tree, task.base, task.lora)
  reader = task.reader(params)
  comp = io.cached_json(os.path.join(workdir, 'competence.json'), cache_key(config, step),
                        lambda: competence(reader, config, task.task, task.held_out))
  log(fmt_competence(name, comp))
  return dict(trained=trained, step=step, competence=comp, reader=reader, params=params,
              task=task)
