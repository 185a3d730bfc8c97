"""A reader on the shipped factual-QA data: EM / token F1, open book vs closed book.

  python -m experiments.reader_eval --config configs/reader_eval.py --workdir runs/reader_eval

Items: the first `n_per_source` Natural Questions and SQuAD examples of
`config.split` in a seeded order (`order_key`), skipping (and listing by id)
those whose open-book prompt is longer than `config.max_prompt_tokens` tokens:
nothing is truncated. Conditions per item:
  open_book   — the gold passage (all its sentences) and the question;
  closed_book — the question alone.
Each prompt starts with `config.n_shots` solved demonstrations in the same
condition (examples of `config.shot_split` with short passages, alternating NQ
and SQuAD, in the seeded order): in chat mode earlier user / assistant turns of
a ChatML conversation, in plain mode "… Answer: <gold>" blocks. They show the
expected short-answer format, and as the common start of every prompt they are
computed once (the decoder's shared-prefix cache). The reader answers greedily
(stop at a newline or the end-of-turn token); the prediction is its text up to
the first newline. Scores per item (SQuAD v1.1
normalisation, `metrics.text`): EM, token F1, and `copied` = the normalised
prediction is non-empty and occurs in the normalised gold passage (for both
conditions: the closed-book rate is the chance-overlap baseline).

The job runs on the one job contract (`ceu_jax.jobs.run_job`: the workdir lock,
the config check against W/job.json, W/units/ resumed, atomic outputs,
progress); a unit is one chunk of items of one source in one condition. Outputs:
  plan.json               the selected ids and the skipped ones (with lengths)
  rows.csv                one row per (item, condition)
  summary.json            per (source, condition): EM, F1, copied, answered with 95% CIs and n
  table.md                the summary as a markdown table
"""
from __future__ import annotations

import csv
import io as _io
import zlib
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ceu_jax import jobs
from ceu_jax.metrics.resampling import fmt_ci, mean_ci
from ceu_jax.metrics.text import exact_match, normalize_answer, token_f1
from ceu_jax.readers.base import Reader

CONDITIONS = ('open_book', 'closed_book')
SPLITS = ('train', 'validation', 'test')
SOURCES = ('nq', 'squad')
FIELDS = ('id', 'source', 'condition', 'question', 'gold', 'prediction', 'em', 'f1', 'copied',
          'stop_reason', 'prompt_tokens')
METRICS = ('em', 'f1', 'copied', 'answered')


def order_key(seed: int, example_id: str) -> int:
  """Deterministic pseudo-random rank of an example (independent of file order)."""
  return zlib.crc32(f'{seed}:{example_id}'.encode())


def passage_text(passage: dict) -> str:
  return ' '.join(passage['sentences'])


def item_text(config: Any, question: str, context: Optional[str]) -> str:
  """One question as the user states it (context None: closed book)."""
  q = question.strip()
  q = q[0].upper() + q[1:] if q else q
  q = q if q.endswith('?') else q + '?'
  body = f'Question: {q}' if context is None else f'Context: {context}\n\nQuestion: {q}'
  return f'{body}\n{config.instruction}' if config.instruction else body


def make_prompt(config: Any, shots: Sequence[dict], question: str,
                context: Optional[str]) -> Any:
  """The whole prompt of one item: demonstrations, then the question (module doc).

  Chat mode: a list of (role, content) messages; plain mode: a string.
  """
  open_book = context is not None
  demos = [(item_text(config, s['question'], s['context'] if open_book else None),
            s['answer']) for s in shots]
  last = item_text(config, question, context)
  if config.chat:
    msgs = [m for user, answer in demos for m in (('user', user), ('assistant', answer))]
    return msgs + [('user', last)]
  return ''.join(f'{user}\nAnswer: {answer}\n\n' for user, answer in demos) + f'{last}\nAnswer:'


def select_shots(config: Any) -> list[dict]:
  """config.n_shots demonstrations (module doc)."""
  from ceu_jax.data.factqa import storage
  passages = storage.read_passages()
  pool = sorted((e for e in storage.read_examples() if e['split'] == config.shot_split),
                key=lambda e: order_key(config.seed, e['id']))
  by_source = {src: [] for src in SOURCES}
  for e in pool:
    ctx = passage_text(passages[e['passage_id']])
    words = len(ctx.split())
    if (config.shot_min_words <= words <= config.shot_max_words
        and len(by_source[e['source']]) < config.n_shots):
      by_source[e['source']].append({'id': e['id'], 'question': e['question'],
                                     'answer': e['answer'], 'context': ctx})
  return [by_source[SOURCES[i % 2]][i // 2] for i in range(config.n_shots)]


def prediction_of(text: str) -> str:
  """The answer: the generated text up to its first newline, stripped."""
  return text.strip().split('\n')[0].strip()


def copied_from(prediction: str, context: str) -> bool:
  p = normalize_answer(prediction)
  return bool(p) and f' {p} ' in f' {normalize_answer(context)} '


def select_items(config: Any, shots: Sequence[dict], count_tokens: Callable[[Any], int]) -> dict:
  """{'items': {source: [example dicts + 'context']}, 'skipped': [...]} (module doc)."""
  from ceu_jax.data.factqa import storage
  examples = [e for e in storage.read_examples() if e['split'] == config.split]
  passages = storage.read_passages()
  out, skipped = {}, []
  for src in SOURCES:
    pool = sorted((e for e in examples if e['source'] == src),
                  key=lambda e: order_key(config.seed, e['id']))
    chosen = []
    for e in pool:
      if len(chosen) >= config.n_per_source:
        break
      ctx = passage_text(passages[e['passage_id']])
      if e['id'] in {s['id'] for s in shots}:
        continue
      n = count_tokens(make_prompt(config, shots, e['question'], ctx))
      if n > config.max_prompt_tokens:
        skipped.append({'id': e['id'], 'tokens': n})
        continue
      chosen.append({'id': e['id'], 'source': src, 'question': e['question'],
                     'answer': e['answer'], 'context': ctx})
    if len(chosen) < config.n_per_source:
      raise ValueError(f'split {config.split!r} has only {len(chosen)} usable {src} items '
                       f'(n_per_source={config.n_per_source})')
    out[src] = chosen
  return {'items': out, 'skipped': skipped}


def _chunk_rows(reader: Reader, config: Any, shots: Sequence[dict], items: Sequence[dict],
                condition: str) -> list:
  prompts = [make_prompt(config, shots, it['question'],
                         it['context'] if condition == 'open_book' else None) for it in items]
  gens = reader.generate(prompts, max_new_tokens=config.max_new_tokens, stop=['\n'],
                         ids=[it['id'] for it in items])
  rows = []
  for it, p, g in zip(items, prompts, gens):
    pred = prediction_of(g.text)
    rows.append({'id': it['id'], 'source': it['source'], 'condition': condition,
                 'question': it['question'], 'gold': it['answer'], 'prediction': pred,
                 'em': exact_match(pred, it['answer']), 'f1': token_f1(pred, it['answer']),
                 'copied': float(copied_from(pred, it['context'])),
                 'stop_reason': g.stop_reason,
                 'prompt_tokens': len(reader.prompt_ids(p))
                 if hasattr(reader, 'prompt_ids') else -1})
  return rows


def summarise(rows: Sequence[dict], config: Any) -> dict:
  """Per (source, condition) and per condition over both sources: metric Aggregates."""
  out = {}
  groups = [(s, c) for s in SOURCES + ('all',) for c in CONDITIONS]
  for src, cond in groups:
    sel = [r for r in rows if r['condition'] == cond and (src == 'all' or r['source'] == src)]
    vals = {'em': [r['em'] for r in sel], 'f1': [r['f1'] for r in sel],
            'copied': [r['copied'] for r in sel],
            'answered': [float(bool(normalize_answer(r['prediction']))) for r in sel]}
    out[f'{src}/{cond}'] = {m: mean_ci(np.asarray(v, np.float64), seed=config.bootstrap_seed,
                                       num_resamples=config.num_resamples).to_dict()
                            for m, v in vals.items()}
  return out


def _fmt(a: dict) -> str:
  return fmt_ci(a, missing='n/a')


def markdown_table(summary: dict) -> str:
  lines = ['| source | condition | n | EM | token F1 | copied from the passage | answered |',
           '|---|---|---|---|---|---|---|']
  for key, s in summary.items():
    src, cond = key.split('/')
    lines.append(f"| {src} | {cond.replace('_', ' ')} | {s['em']['n']} | {_fmt(s['em'])} | "
                 f"{_fmt(s['f1'])} | {_fmt(s['copied'])} | {_fmt(s['answered'])} |")
  return '\n'.join(lines) + '\n'


def _csv(rows: Sequence[dict]) -> str:
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=FIELDS)
  w.writeheader()
  for r in rows:
    w.writerow({k: r[k] for k in FIELDS})
  return buf.getvalue()


def validate(config: Any) -> None:
  """Every field the job reads, checked before anything is built or written."""
  for name, lo in (('n_per_source', 1), ('items_per_chunk', 1), ('max_prompt_tokens', 1),
                   ('max_new_tokens', 1), ('batch_size', 1), ('n_shots', 0), ('n_layers', 0),
                   ('num_resamples', 1), ('shot_min_words', 0)):
    v = config[name]
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
      raise ValueError(f'{name} must be an integer >= {lo}, got {v!r}')
  if config.shot_max_words < config.shot_min_words:
    raise ValueError(f'shot_max_words ({config.shot_max_words}) must be >= shot_min_words '
                     f'({config.shot_min_words})')
  for name in ('split', 'shot_split'):
    if config[name] not in SPLITS:
      raise ValueError(f'{name} must be one of {SPLITS}, got {config[name]!r}')


class ReaderEvalJob(jobs.Job):
  """The reader evaluation on the one job contract: a unit is one chunk of items of
  one source in one condition (W/units/<source>_<condition>_<k>.json)."""
  name = 'reader_eval'

  def __init__(self, config: Any, reader: Optional[Reader] = None):
    validate(config)
    super().__init__(config)
    self.reader = reader

  def prepare(self, ctx):
    if self.reader is None:
      from ceu_jax import readers
      self.reader = readers.from_config(self.config)
    if ctx.exists('plan.json'):   # the same config (job.json): the same selection
      self.plan_ = ctx.read_json('plan.json')
      return
    reader = self.reader
    count = (lambda prompt: len(reader.prompt_ids(prompt))) if hasattr(reader, 'prompt_ids') \
        else (lambda prompt: len(str(prompt).split()))
    shots = select_shots(self.config)
    plan = select_items(self.config, shots, count)
    plan['shots'] = shots
    ctx.write_json('plan.json', plan)
    self.plan_ = plan

  def plan(self, ctx):
    cs = self.config.items_per_chunk
    return [jobs.Unit(f'{src}_{cond}_{k // cs:04d}', (src, cond, k)) for src in SOURCES
            for cond in CONDITIONS for k in range(0, len(self.plan_['items'][src]), cs)]

  def run_unit(self, ctx, spec):
    src, cond, k = spec
    items = self.plan_['items'][src][k:k + self.config.items_per_chunk]
    return _chunk_rows(self.reader, self.config, self.plan_['shots'], items, cond)

  def describe_unit(self, spec, result):
    return f'{spec[0]} {spec[1]} items {spec[2]}..{spec[2] + len(result) - 1}'

  def summarize(self, ctx, results):
    rows = [r for u in self.plan(ctx) for r in results[u.key]]
    return {'groups': summarise(rows, self.config),
            'n_items': {s: len(self.plan_['items'][s]) for s in SOURCES},
            'skipped_too_long': self.plan_['skipped'], 'split': self.config.split,
            'max_prompt_tokens': self.config.max_prompt_tokens}

  def write(self, ctx, results, summary):
    rows = [r for u in self.plan(ctx) for r in results[u.key]]
    ctx.write_text('rows.csv', _csv(rows))
    ctx.write_text('table.md', markdown_table(summary['groups']))


def run_reader_eval(config: Any, workdir: str, reader: Optional[Reader] = None,
                    log: Callable[[str], None] = print) -> dict:
  """Select items, answer them in chunks (resumable), write rows, summary and table."""
  return jobs.run_job(ReaderEvalJob(config, reader), workdir, log=log)
