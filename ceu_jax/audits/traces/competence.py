"""The competence check before the trace audit, and the run of a trace fine-tune (issue #35).

  out = run(config, workdir)   # trains unless W holds a completed run; W/competence.json

`competence(reader, config, domain, items)`: greedy traces of held-out uncorrupted problems
(`finetune.eval_items`) through the audit's prompt, budget, stop and parse rules: parse
rate, answer accuracy (unparsed = wrong), own-trace consistency (the answer its own steps
imply, `arithmetic.implied`); and on the same problems with one seeded Strength-1
corruption forced (LogicFlip / FactReversal, `finetune.make_row`): how often the parsed
answer is the implied one (follow) and the gold (gold). `competent` = accuracy >=
eval.min_accuracy and parse rate >= eval.min_parse_rate: a reader below is reported as not
competent, never audited as if it had learned the task. Every rate carries its percentile
bootstrap 95% CI over problems and its n (SPEC §8: 1,000 resamples, seed 42; `cis`, printed
by `summary.fmt_rate`); the gate compares the point values with the thresholds. With
memorised problems (data.memorised > 0, `finetune`) the same measures on them, under
`memorised`: a shortcut reader answers them with the gold whatever the forced trace says, a
following reader with the trace's answer. `run` trains a smollm2_traces config in the one loop unless its workdir holds a completed run (the adapters are reused),
restores the adapters, merges them into the weights for an ordinary SmolLM2Reader and
writes W/competence.json (reused while the eval section and checkpoint step are unchanged).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Sequence


from ceu_jax import io
from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces.summary import fmt_rate, rate_ci
from ceu_jax.audits.traces.finetune import (EVAL_SALT, SmolLM2TraceTask, draw, eval_items,
                                            make_row, pool_items)
from ceu_jax.pretrained import lora as lora_lib

CIS = 'percentile bootstrap 95%, 1000 resamples over problems, seed 42'  # SPEC §8


def measure(reader, config: Any, dom: ar.ArithmeticDomain, items: Sequence[ar.ArithItem],
            salt: int = EVAL_SALT) -> dict:
  """Greedy traces of `items` (parse rate, accuracy, own-trace consistency) and, on the same
  items with one seeded Strength-1 corruption forced, follow / gold rates (module doc)."""
  t0, e, p = time.time(), config.eval, dom.primer
  budget = int(e.max_new_tokens)
  ids = [x.id for x in items]
  gens = reader.generate([dom.prompt(x) for x in items], max_new_tokens=budget,
                         stop=dom.stop, ids=ids)
  # per problem: parsed, correct (unparsed: wrong); per parsed problem: own trace
  parsed_l, correct_l, own_l = [], [], []
  for x, g in zip(items, gens):
    tr = None if dom.cut(g) else dom.parse(p + g.text)
    parsed_l.append(tr is not None)
    if tr is None:
      correct_l.append(False)
      continue
    correct_l.append(dom.similarity(tr.answer, x.answer) == 1.0)
    imp = ar.implied(x, tr.steps).answer
    own_l.append(imp is not None and dom.similarity(tr.answer, str(imp)) == 1.0)
  parsed, correct, own = sum(parsed_l), sum(correct_l), sum(own_l)
  rows = []
  for i, x in enumerate(items):   # one Strength-1 corruption per item (seeded)
    _, k, tau = draw(int(config.seed), salt, i, len(x.ops), tuple(config.data.taus))
    row = make_row(dom, x, 'following', k, tau)
    if row.k and row.implied != row.gold:
      rows.append(row)
  conts = reader.continue_from([r.prompt for r in rows],
                               [[s for s in (r.kept, r.block) if s] for r in rows],
                               max_new_tokens=budget, stop=dom.stop,
                               ids=[(r.item.id, r.k, r.tau) for r in rows]) if rows else []
  c_parsed_l, follow_l, gold_l = [], [], []   # per corruption: parsed; follow, gold (parsed)
  for r, g in zip(rows, conts):
    tr = None if dom.cut(g) else dom.parse(p + r.forced + g.text)
    c_parsed_l.append(tr is not None)
    if tr is None:
      continue
    follow_l.append(dom.similarity(tr.answer, r.implied) == 1.0)
    gold_l.append(dom.similarity(tr.answer, r.gold) == 1.0)
  c_parsed, follow, gold = sum(c_parsed_l), sum(follow_l), sum(gold_l)
  n = len(items)
  rate = lambda a, b: a / b if b else None
  acc_parsed = [c for c, q in zip(correct_l, parsed_l) if q]
  return dict(n=n, n_parsed=parsed, parse_rate=parsed / n, accuracy=correct / n,
              accuracy_parsed=rate(correct, parsed), own_trace=rate(own, parsed),
              cis=dict(parse_rate=rate_ci(parsed_l), accuracy=rate_ci(correct_l),
                       accuracy_parsed=rate_ci(acc_parsed), own_trace=rate_ci(own_l)),
              corrupted=dict(n=len(rows), n_parsed=c_parsed,
                             parse_rate=rate(c_parsed, len(rows)),
                             follow=rate(follow, c_parsed), gold=rate(gold, c_parsed),
                             cis=dict(parse_rate=rate_ci(c_parsed_l), follow=rate_ci(follow_l),
                                      gold=rate_ci(gold_l))),
              wall_s=round(time.time() - t0, 1))


def competence(reader, config: Any, dom: ar.ArithmeticDomain,
               items: Sequence[ar.ArithItem]) -> dict:
  """The competence check of a reader on held-out problems (module doc); with memorised
  problems (data.memorised > 0) the same measures on them under `memorised` (where a
  shortcut reader shows: the gold answer whatever the forced trace says)."""
  e = config.eval
  out = dict(measure(reader, config, dom, items), min_accuracy=float(e.min_accuracy),
             min_parse_rate=float(e.min_parse_rate))
  out['competent'] = bool(out['accuracy'] >= out['min_accuracy']
                          and out['parse_rate'] >= out['min_parse_rate'])
  pool = pool_items(config)
  if pool:
    out['memorised'] = measure(reader, config, dom, pool)
  return out


def fmt_competence(name: str, c: dict) -> str:
  """One log line: every rate with its 95% CI and n (`summary.fmt_rate`); the gate compares
  the point values with the thresholds."""
  k, m = c['corrupted'], c.get('memorised')
  return (f"{name}: {'competent' if c['competent'] else 'NOT competent'} on {c['n']} held-out "
          f"problems (gate on the point values): answer accuracy {fmt_rate(c, 'accuracy')} "
          f"(>= {c['min_accuracy']}), parse rate {fmt_rate(c, 'parse_rate')} "
          f"(>= {c['min_parse_rate']}), own-trace {fmt_rate(c, 'own_trace')}; "
          f"corrupted step forced ({k['n']}): follow {fmt_rate(k, 'follow')}, gold "
          f"{fmt_rate(k, 'gold')}, parse {fmt_rate(k, 'parse_rate')}" + ('' if m is None else
          f"; memorised problems ({m['n']}): accuracy {fmt_rate(m, 'accuracy')}, corrupted "
          f"step forced: follow {fmt_rate(m['corrupted'], 'follow')}, gold "
          f"{fmt_rate(m['corrupted'], 'gold')}"))


def cache_key(config: Any, step: int, **extra) -> dict:
  """What a cached competence.json was computed for: the eval section, the checkpoint step,
  the CIs' recipe (a check cached before its rates carried CIs is recomputed) and, with
  memorised problems, their number (a key without it: none)."""
  key = dict(eval=config.eval.to_dict(), step=step, cis=CIS, **extra)
  if int(config.data.get('memorised', 0)):
    key['memorised'] = int(config.data.memorised)
  return key


competence_cached = io.cached_json   # W/…/competence.json, recomputed when its key changed


def run(config: Any, workdir: str, *, log: Callable[[str], None] = print, load=None,
        fresh: bool = False, task: Optional[SmolLM2TraceTask] = None) -> dict:
  """Train unless `workdir` holds a completed run, then the competence check (cached in
  W/competence.json). Returns {trained, step, competence, reader, params (adapters merged),
  task}."""
  from ceu_jax.audits import reader_finetune
  from ceu_jax.train import loop
  task = task or SmolLM2TraceTask.from_config(config, load=load)
  trained = reader_finetune.train_unless_done(config, workdir, task,
                                              f'smollm2_{config.data.regime}', log=log,
                                              fresh=fresh)
  tree, step = loop.restore_trainable(task, workdir)
  params = lora_lib.merged(tree, task.base, task.lora)
  reader = task.reader(params)
  key = cache_key(config, step)
  comp = competence_cached(os.path.join(workdir, 'competence.json'), key,
                           lambda: competence(reader, config, task.domain, eval_items(config)))
  log(fmt_competence(f'smollm2_{config.data.regime}', comp))
  return dict(trained=trained, step=step, competence=comp, reader=reader, params=params,
              task=task)
