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
C(M)). `competent` = checklist accuracy >= eval.min_accuracy and decision parse rate >= eval.min_parse_rate: a reader
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

from ceu_jax import io
from ceu_jax.audits.mediator import audit
from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.audits.mediator.finetune import SmolLM2ChecklistTask
from ceu_jax.pretrained import lora as lora_lib


def competence(reader, config: Any, task: ct.TextChecklistTask,
               items: Sequence[ct.Checklist], seed: int = 42) -> dict:
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
             wall_s=round(time.time() - t0, 1))
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


def fmt_competence(name: str, c: dict) -> str:
  v = lambda a: '—' if not a or a.get('value') is None else f"{a['value']:.3f}"
  return (f"{name}: {'competent' if c['competent'] else 'NOT competent'} on {c['n']} held-out "
          f"checklists: checklist accuracy {c['checklist_accuracy']:.3f} (>= "
          f"{c['min_accuracy']}), lines right {c['line_accuracy']:.3f} (a constant answer "
          f"{c['line_constant']:.3f}), decision parse rate {c['decision_parse_rate']:.3f} (>= "
          f"{c['min_parse_rate']}), F_ID {v(c['F_ID'])}; changed checklist forced "
          f"({c['n_CNF']}): follows C(M*) {v(c['cons_CNF'])}")


def table(comps: dict) -> str:
  """Markdown: one row per fine-tuned setting's competence check."""
  v = lambda a: '—' if not a or a.get('value') is None else f"{a['value']:.3f}"
  lines = ['| setting | competent | n | checklist accuracy | lines right (constant answer) | '
           'decision parse rate | F_ID | changed M forced: follows C(M*) (n) | wall s |',
           '|---|---|---:|---|---|---|---|---|---:|']
  for k, c in comps.items():
    lines.append(f"| {k} | {'yes' if c['competent'] else '**no**'} | {c['n']} | "
                 f"{c['checklist_accuracy']:.3f} | {c['line_accuracy']:.3f} "
                 f"({c['line_constant']:.3f}) | {c['decision_parse_rate']:.3f} | "
                 f"{v(c['F_ID'])} | {v(c['cons_CNF'])} ({c['n_CNF']}) | {c['wall_s']:.0f} |")
  return '\n'.join(lines)


def cache_key(config: Any, step: int) -> dict:
  """What a cached competence.json was computed for: the eval section, the step and the
  fields computed (COMPETENCE_FIELDS: a check written before a field existed is redone)."""
  return dict(eval=config.eval.to_dict(), step=step, fields=COMPETENCE_FIELDS)


COMPETENCE_FIELDS = 2   # 2: line_accuracy and line_constant added


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
