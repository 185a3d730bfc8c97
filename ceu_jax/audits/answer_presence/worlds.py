"""The worlds of the answer-presence job (configs/answer_presence.py `world`; the fourth,
`atr_separate`, is World A with answer string and evidence apart: separate.py).

A world knows its readers, its baselines and how to audit one chunk of
records with one reader (`chunk(reader_name, k)` → `audit_chunk`'s dict).
`make_world(config)` validates the config (a clear error naming the field) before
anything is built. Readers are built lazily, on the first chunk that needs
them (World A trains its families then; World B loads SmolLM2 then).
"""
from __future__ import annotations

import dataclasses
import os
import random
from typing import Any, Callable, Sequence

import numpy as np

from ceu_jax import io
from ceu_jax import claims
from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.audits.answer_presence import report
from ceu_jax.audits.answer_presence import separate
from ceu_jax.audits.answer_presence import sentinels as sp
from ceu_jax.metrics.resampling import fmt_ci, mean_ci

FAMILIES = ('attention', 'ssm', 'memory_port')  # architectures.FAMILIES (not imported here)
GENERATED_READERS = ('copy', 'closed_book')
_LETTERS = 'bcdefghijlnoprtuvwxyz'  # no letter of '[mask]'


def _need(cond: bool, msg: str) -> None:
  if not cond:
    raise ValueError(msg)


def make_world(config) -> Any:
  """The world of `config` (validated)."""
  worlds = {'generated': GeneratedWorld, 'atr': ATRWorld, 'factqa': FactQAWorld,
            'atr_separate': SeparateWorld}  # World A with answer string and evidence apart
  _need(config.world in worlds, f'config.world must be one of {sorted(worlds)}, got {config.world!r}')
  for k in ('n_records', 'items_per_chunk'):
    _need(isinstance(config[k], int) and config[k] >= 1, f'config.{k} must be an int >= 1, got {config[k]!r}')
  return worlds[config.world](config)


class _World:
  readers: tuple = ()
  baselines: tuple = ()
  title = ''
  companion_name = ''
  n_records = 0

  def __init__(self, config):
    self.config = config
    self.log: Callable[[str], None] = print
    self._readers: dict = {}

  @property
  def n_chunks(self) -> int:
    return -(-self.n_records // self.config.items_per_chunk)

  def _slice(self, seq: Sequence, k: int) -> list:
    cs = self.config.items_per_chunk
    return list(seq[k * cs:(k + 1) * cs])

  def reader(self, name: str):
    if name not in self._readers:
      self._readers[name] = self._build_reader(name)
    return self._readers[name]

  def extra_summary(self, parts) -> dict:
    return {}

  def reader_summary(self, name, parts) -> dict:
    """World-specific entries of one reader's summary (beside _summarise_reader's)."""
    return {}

  def extra_claims(self, summary) -> list:
    """World-specific claims decided by rule (beside job.headline_claims)."""
    return []

  def extra_report(self, summary) -> list:
    return []

  def describe(self, summary) -> str:
    return ''


def audit_chunk(reader, medium, by_baseline: dict, *, loglik: bool,
                identity_baselines: Sequence[str], scorer=None) -> dict:
  """Everything one reader gives on one chunk of records (JSON-able).

  by_baseline: {'B1': raw records, 'B2': ..., ...}. Per baseline: skipped ids
  per reason, per-record (bucket, companion bucket, F1, log-lik, answer) and,
  for every baseline but B1, the audit rows; the sentinel panel on B2. `scorer` (of
  this reader and medium) shares its answers with the caller.
  """
  scorer = scorer if scorer is not None else ap.Scorer(reader, medium, loglik=loglik)
  reader = scorer.reader
  out: dict = dict(skipped={}, scores={}, rows={}, panel=None)
  for b, recs in by_baseline.items():
    v = ap.validate(recs, medium=medium)
    out['skipped'][b] = {k: [str(i) for i in ids] for k, ids in v.skipped_ids.items()}
    res = scorer.results(v.kept, [r.context for r in v.kept])
    out['scores'][b] = [dict(id=str(r.id), bucket=ap.bucket(r, medium),
                             bucket_companion=ap.bucket(r, medium, companion=True),
                             f1=x[0], loglik=x[1], answer=x[2]) for r, x in zip(v.kept, res)]
    if b == 'B1':
      continue
    rows = ap.run_audit(reader, v.kept, scorer=scorer, identity=b in identity_baselines)
    for x in rows:
      x.pop('context')
      x['id'] = str(x['id'])
    out['rows'][b] = rows
    if b == 'B2':
      f1 = sp.panel_f1(reader, v.kept, scorer=scorer)
      out['panel'] = {k: ([str(i) for i in val] if k in ('ids', 'no_placebo')
                          else np.asarray(val, np.float64).tolist()) for k, val in f1.items()}
  out['calls'] = scorer.calls
  return out


# ---------------------------------------------------------------- generated (oracles)
def generated_records(n: int, seed: int, p_raw: float = 0.7, p_keep: float = 0.8,
                      p_surface: float = 0.2) -> list[ap.Record]:
  """n text records; raw holds the gold with p_raw, the compile keeps it with p_keep
  (surfaces it when raw lacks it with p_surface); coincidental case changes included."""
  rng = random.Random(seed)

  def word():
    return ''.join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 7)))

  def text(words, gold, has):
    words = list(words)
    for _ in range(rng.randint(1, 3) if has else 0):
      words.insert(rng.randint(0, len(words)), gold.upper() if rng.random() < 0.3 else gold)
    out, k = [], 0
    while k < len(words):
      m = rng.randint(3, 8)
      out.append(' '.join(words[k:k + m]) + '.')
      k += m
    return ' '.join(out)

  recs = []
  for i in range(n):
    gold = ' '.join(word() for _ in range(rng.randint(1, 3)))
    filler = [word() for _ in range(rng.randint(12, 40))]
    raw_has = rng.random() < p_raw
    comp_has = rng.random() < (p_keep if raw_has else p_surface)
    recs.append(ap.Record(f'g{seed}-{i}', f'what is item {i}', (gold,),
                          text(filler[::-1], gold, comp_has), text(filler, gold, raw_has)))
  return recs


class GeneratedWorld(_World):
  """Seeded text records, oracle readers ('copy' uses its evidence, 'closed_book' ignores it)."""
  baselines = ('B1', 'B2')
  title = 'generated text records, oracle reader'
  companion_name = 'SQuAD-normalised words'

  def __init__(self, config):
    super().__init__(config)
    _need(config.reader in GENERATED_READERS,
          f'config.reader must be one of {GENERATED_READERS}, got {config.reader!r}')
    self.readers = (config.reader,)
    self.n_records = config.n_records
    g = config.generated
    self.medium = ap.TextMedium(max_new_tokens=g.max_new_tokens,
                                max_context_chars=g.max_context_chars or None)

  def prepare(self, workdir, log):
    self.log = log
    self.records = generated_records(self.config.n_records, self.config.seed)

  def _build_reader(self, name):
    from ceu_jax.readers.oracles import ClosedBookOracle, CopyOracle, question_of
    if name == 'copy':
      return CopyOracle(candidates={r.id: list(r.golds) for r in self.records})
    return ClosedBookOracle(table={question_of(ap.default_prompt('x', r.question)): r.golds[0]
                                   for r in self.records[::2]})  # knows every other answer

  def chunk(self, name, k):
    recs = self._slice(self.records, k)
    by = {'B1': [dataclasses.replace(r, context=r.raw_context) for r in recs], 'B2': recs}
    return audit_chunk(self.reader(name), self.medium, by, loglik=False,
                       identity_baselines=('B2',))

  def describe(self, summary):
    return (f"{summary['n_records']} generated records; reader `{self.config.reader}`; "
            'B1 = raw context, B2 = the generated compile.')


# ---------------------------------------------------------------- World A
class ATRWorld(_World):
  """World A (ceu_jax.audits.answer_presence.atr_world): trained ATR readers, line-filter rewriters."""
  baselines = ('B1', 'B2', 'B3', 'B4')
  title = 'World A: ATR-insert, trained readers'
  companion_name = 'evidence line present'

  def __init__(self, config):
    super().__init__(config)
    from ceu_jax.audits.answer_presence import atr_world
    from ceu_jax.data import tasks
    x = config.atr
    fams = tuple(x.families)
    _need(len(fams) >= 1 and all(f in FAMILIES for f in fams) and len(set(fams)) == len(fams),
          f'config.atr.families must be distinct entries of {FAMILIES}, got {fams}')
    for k in ('eta', 'p_drop', 'p_surface'):
      _need(0.0 <= float(x[k]) <= 1.0, f'config.atr.{k} must be in [0, 1], got {x[k]}')
    self.readers = fams
    self.n_records = config.n_records
    data = x.train.data.copy_and_resolve_references()
    data.eta = float(x.eta)
    self.data_cfg = tasks.data_config(data)
    self.medium = atr_world.ATRMedium(self.data_cfg)
    self.training: dict = {}
    from ceu_jax.audits.trained import check_train_config
    for family in fams:
      check_train_config(self.train_config(family), 'atr.train')

  def prepare(self, workdir, log):
    from ceu_jax.audits.answer_presence import atr_world
    self.log, self.workdir = log, workdir
    self.raw = atr_world.raw_records(self.data_cfg, self.n_records, self.config.seed)

  def train_dir(self, family):
    return os.path.join(self.workdir, 'train', family)

  def train_config(self, family):
    c = self.config.atr.train.copy_and_resolve_references()
    c.model.family = family
    return c

  def _build_reader(self, family):
    from ceu_jax.audits.trained import trained_reader
    reader, loaded = trained_reader(self.train_config(family), self.train_dir(family), self.log,
                                    batch_size=self.config.atr.batch_size)
    return reader

  def chunk(self, family, k):
    from ceu_jax.audits.answer_presence import atr_world
    x = self.config.atr
    raw = self._slice(self.raw, k)
    by = {b: atr_world.compiled_records(self.medium, raw, b, p_drop=x.p_drop,
                                        p_surface=x.p_surface, seed=x.rewriter_seed)
          for b in self.baselines}
    return audit_chunk(self.reader(family), self.medium, by, loglik=bool(x.loglik),
                       identity_baselines=self.baselines)

  def extra_summary(self, parts):
    from ceu_jax import workdir as workdir_lib
    runs = {}
    for f in self.readers:
      info = workdir_lib.run_info(self.train_dir(f))
      runs[f] = {k: info[k] for k in ('checkpoint_step', 'num_steps', 'completed', 'warning')}
    return dict(training=runs, raw_data=dict(dataclasses.asdict(self.data_cfg)))

  def describe(self, summary):
    d = self.data_cfg
    x = self.config.atr
    steps = ', '.join(f"{f} step {r['checkpoint_step']}" for f, r in summary['training'].items())
    return (f"{summary['n_records']} ATR-insert test examples (smoke world: n = {d.context_len}, "
            f'{d.num_passages} passages, {d.n_values} values, ρ = {d.rho}, δ = {d.delta}, '
            f'η = {d.eta}); readers trained as in the smoke grid ({steps}). Rewriters: B2 '
            f'keeps lines with the query ID, B3 with its KEY, B4 = B2\'s compile verified by B3\'s '
            f'KEY filter; p_drop = {x.p_drop}, '
            f'p_surface = {x.p_surface}. Score: EM × 100 (= token F1 for one-token values); '
            'present = the gold VALUE token anywhere; companion = the evidence line present. '
            'Panel arms are padded to the longest sentinel (3 tokens).')


# ---------------------------------------------------------------- World B
class FactQAWorld(_World):
  """World B (ceu_jax.audits.answer_presence.factqa_world): SmolLM2 reader and rewriter on NQ / SQuAD."""
  baselines = ('B1', 'B2', 'B3', 'B4')
  readers = ('smollm2',)
  title = 'World B: SmolLM2-135M-Instruct on Natural Questions / SQuAD'
  companion_name = 'SQuAD-normalised words'

  def __init__(self, config):
    super().__init__(config)
    f = config.factqa
    _need(len(f.sources) >= 1 and all(s in ('nq', 'squad') for s in f.sources),
          f"config.factqa.sources must be a non-empty subset of ('nq', 'squad'), got {f.sources}")
    _need(0.0 <= float(f.eta) <= 1.0, f'config.factqa.eta must be in [0, 1], got {f.eta}')
    for k in ('max_new_tokens', 'rewrite_max_new_tokens', 'extract_sentences', 'batch_size',
              'max_passage_words', 'n_distractors'):
      _need(int(f[k]) >= 1, f'config.factqa.{k} must be >= 1, got {f[k]}')
    self.n_records = config.n_records

  def prepare(self, workdir, log):
    from ceu_jax.audits.answer_presence import factqa_world as fw
    self.log = log
    f, path = self.config.factqa, os.path.join(workdir, 'plan.json')
    if os.path.exists(path):
      plan = io.read_json(path)
    else:
      items = fw.select_items(self.config.n_records, seed=self.config.seed, sources=f.sources,
                              split=f.split, max_passage_words=f.max_passage_words,
                              n_distractors=f.n_distractors, eta=f.eta)
      plan = dict(items=[dataclasses.asdict(it) for it in items],
                  shots=fw.select_shots(f.n_shots, seed=self.config.seed))
      io.write_json_atomic(path, plan)
    self.items = [fw.Item(**it) for it in plan['items']]
    self.shots = plan['shots']
    self.medium = ap.TextMedium(prompt_fn=fw.make_prompt_fn(self.shots, f.chat),
                                max_new_tokens=f.max_new_tokens, stop=('\n',),
                                max_context_chars=f.max_context_chars or None)

  def _build_reader(self, name):
    from ceu_jax import readers
    return readers.from_config(self.config.factqa)

  def chunk(self, name, k):
    from ceu_jax.audits.answer_presence import factqa_world as fw
    f = self.config.factqa
    items = self._slice(self.items, k)
    reader = self.reader(name)
    kk = f.extract_sentences
    comp = {'B2': [fw.extractive(it.raw, it.question, kk) for it in items],
            'B3': fw.rewrite_with_model(reader, items, f.rewrite_max_new_tokens)}
    comp['B4'] = fw.verify_with_model(reader, items, comp['B2'])   # A's compile verified by B
    comp['control'] = [fw.first_sentences(it.raw, kk) for it in items]
    out = audit_chunk(reader, self.medium, fw.records(items, comp), loglik=False,
                      identity_baselines=('B2',))
    out['calls'] += len(items) + sum(len(fw.sentences(c)) for c in comp['B2'])  # rewriter B
    out['compiles'] = [dict(id=it.id, source=it.source, gold_in_raw=it.gold_in_raw,
                            **{b: comp[b][j] for b in ('B2', 'B3', 'B4', 'control')})
                       for j, it in enumerate(items)]
    return out

  def extra_summary(self, parts):
    seed = self.config.bootstrap_seed
    comps = [c for p in parts for c in p['compiles']]
    gold = {it.id: (it.answer,) for it in self.items}
    raw = {it.id: it.raw for it in self.items}
    contain = {'B1 (raw)': [ap.present(raw[c['id']], gold[c['id']]) for c in comps]}
    for b in ('B2', 'B3', 'B4', 'control'):
      contain[b] = [ap.present(c[b], gold[c['id']]) for c in comps]
    words = {b: [len(c[b].split()) for c in comps] for b in ('B2', 'B3', 'B4', 'control')}
    words['B1 (raw)'] = [len(raw[c['id']].split()) for c in comps]
    return dict(
        containment={b: mean_ci(np.asarray(v, np.float64), seed=seed).to_dict()
                     for b, v in contain.items()},
        compile_words={b: float(np.mean(v)) for b, v in words.items()},
        sources={s: sum(c['source'] == s for c in comps) for s in self.config.factqa.sources},
        gold_passage_in_raw=sum(c['gold_in_raw'] for c in comps),
        shots=[s['id'] for s in self.shots])

  def extra_report(self, summary):
    from ceu_jax.audits.answer_presence import factqa_world as fw
    lines = ['', '## Answer containment per rewriter (present(c, g), all items)', '',
             '| rewriter | containment [95% CI] | mean words |', '|---|---|---:|']
    for b, a in summary['containment'].items():
      name = fw.REWRITER_NAMES.get(b.split()[0], b)
      lines.append(f"| {b}: {name} | {fmt_ci(a, with_n=True)} "
                   f"| {summary['compile_words'][b]:.1f} |")
    return lines

  def describe(self, summary):
    f = self.config.factqa
    return (f"{summary['n_records']} items ({summary['sources']}), split {f.split}; raw context = "
            f'gold passage + {f.n_distractors} distractors (≤ {f.max_passage_words} words each), '
            f"gold passage missing at η = {f.eta} ({summary['n_records'] - summary['gold_passage_in_raw']} "
            f'items); rewriters: B2 = A (extractive, {f.extract_sentences} sentences), B3 = B '
            f'(SmolLM2 compress, ≤ {f.rewrite_max_new_tokens} tokens), B4 = A verified by B '
            '(SmolLM2 keeps the sentences of A\'s compile it judges helpful, SPEC §8.1); reader: SmolLM2-135M-Instruct'
            f"{'' if not f.n_layers else f' (first {f.n_layers} layers)'}, {f.n_shots}-shot "
            f'ChatML prompt, ≤ {f.max_new_tokens} new tokens, cut at the first newline.')


class SeparateWorld(ATRWorld):
  """World A (same data, readers and edits) plus Bev / Bval and unbind (module doc)."""
  baselines = separate.BASELINES
  title = 'World A, answer string and evidence apart: ATR-insert, trained readers'

  def chunk(self, family, k):
    x = self.config.atr
    by = separate.compiled(self.medium, self._slice(self.raw, k), p_drop=x.p_drop, p_surface=x.p_surface,
                  seed=x.rewriter_seed)
    scorer = ap.Scorer(self.reader(family), self.medium, loglik=bool(x.loglik))
    out = audit_chunk(None, self.medium, by, loglik=bool(x.loglik),
                                    identity_baselines=self.baselines, scorer=scorer)
    out['separation'] = separate.separation(scorer, by)
    out['calls'] = scorer.calls
    return out

  def reader_summary(self, name, parts):
    return dict(separation=separate.reader_summary(name, parts, self.config.bootstrap_seed))

  def extra_claims(self, summary):
    return [claims.Claim(**c) for r in summary['readers'].values()
            for c in r['separation']['claims']]

  def extra_report(self, summary):
    rd = {n: r['separation'] for n, r in summary['readers'].items()}
    return ['', '## Answer string vs evidence: rewriters that surface one or the other', '',
            'Records whose B2 compile lacks the evidence line; Bev adds it, Bval adds the bare '
            'gold VALUE in the same slot (F1 × 100, paired differences).', '',
            report.separation_rewriter_table(rd), '',
            '## Removing the binding vs removing the VALUE (B2 compiles holding the evidence line)',
            '', report.separation_edit_table(rd), '',
            '## One-token sentinels at the gold span only (d = F1(s) − F1([MASK]))', '',
            report.span_panel_table(rd)]

  def describe(self, summary):
    x = self.config.atr
    return (super().describe(summary).replace('Rewriters: B2 keeps lines with the query ID, B3 '
                                              "with its KEY, B4 = B2's compile verified by B3's "
                                              'KEY filter; ', '')
            + f' Rewriters (separate variant): B2 keeps the lines with the query ID (p_drop = '
            f'{x.p_drop}, no surfacing); where its compile lacks the evidence line, Bev adds the '
            f'full evidence line and Bval the bare gold VALUE ("NOTE v w w w w .") into the same '
            f'free slot (p_surface = {x.p_surface}). unbind: the evidence line\'s ID #q and KEY k '
            '→ [MASK]; its placebo: as many one-token windows of other lines → [MASK].')
