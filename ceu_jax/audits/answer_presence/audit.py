"""Answer-presence audit of a context rewriter (SPEC §8.1, seed 001).

A record is (id, question, gold answers, raw context C, compiled context c).
present(x, g) is a case-insensitive substring match of any gold in x (a
contiguous token match on ATR), so coincidental mentions count. The bucket is
present(C)→present(c). Four edits of c: remove (every gold occurrence → one
sentinel), placebo (as many random non-answer spans of the same word count →
the sentinel, rng seeded by (1729, crc32(id)) so rows are order-independent),
insert_prepend and insert_mid. Effects Δ = F1(edit) − F1(c) (token F1 × 100)
with paired bootstrap CIs (1000 resamples, seed 42); Δcausal = mean over 1→1
rows of Δremove − Δplacebo. The sentinel panel and C2a/C2b rules live in
`ceu_jax.audits.answer_presence.sentinels`, the tables in `ceu_jax.audits.answer_presence.report`.

Everything that depends on what a context *is* (text or ATR tokens) goes
through a `Medium`: `TextMedium` here (strings, the functions below),
`ceu_jax.audits.answer_presence.atr_world.ATRMedium` for token contexts. The audit itself
(`run_audit`, `effects`, `delta_causal`) only sees the medium and a `Reader`.

Bad input (a gold shorter than 2 characters, an empty context, a context that
cannot hold an insert) is skipped with a counted reason, never silently.
No shapes: everything here is per-record Python.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import zlib
from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np

from ceu_jax.metrics import summary as metric_summary
from ceu_jax.metrics.resampling import Aggregate, fmt_ci, mean_ci, paired_difference_ci
from ceu_jax.metrics.text import normalize_answer, token_f1

PLACEBO_SEED = 1729  # SPEC §8.1: placebo rng = (1729, crc32(id))
CI_SEED = 42  # SPEC §8: bootstrap seed
EDITS = ('remove', 'placebo', 'insert_prepend', 'insert_mid')
BUCKETS = ('0→0', '0→1', '1→1', '1→0')
DEFAULT_SENTINEL = '[MASK]'
TEXT_SENTINELS = {  # panel name -> sentinel string (SPEC §8.1)
    '[MASK]': '[MASK]',
    '[REMOVED]': '[REMOVED]',
    'natural': 'the answer was removed',
    'word': 'thing',
    'symbol': '###',
}
SKIP_REASONS = ('gold_too_short', 'empty_context', 'cannot_hold_insert')
_WORD = re.compile(r'\S+')
_BOUNDARY = re.compile(r'[.!?]\s+')


@dataclasses.dataclass(frozen=True)
class Record:
  """One audited question (contexts are strings, or token tuples on ATR)."""
  id: Hashable  # unique item id (seeds the placebo rng through crc32(str(id)))
  question: Any  # the question q (text, or ATR query tokens)
  golds: tuple  # gold answers g (strings of ≥ 2 characters, or token tuples)
  context: Any  # the processed (compiled) context c = R(C, q)
  raw_context: Any = None  # the raw retrieved context C (None: bucket uses c)


# ---------------------------------------------------------------- text edits
def _lowered(text: str) -> tuple[str, list[int]]:
  """text lowered character by character, and for each lowered position the index of the
  character it came from (a character may lower to two: 'İ' → 'i̇'), so that matches
  found in the lowered text map back onto `text` itself."""
  parts = [c.lower() for c in text]
  return ''.join(parts), [i for i, p in enumerate(parts) for _ in p]


def occurrences(text: str, golds: Sequence[str]) -> list[tuple[int, int]]:
  """Disjoint (start, end) spans of `text` holding a gold, leftmost then longest,
  case-insensitive (both lowered character by character; a span covers every character
  a match touches)."""
  low, src = _lowered(text)
  pats = sorted({_lowered(g)[0] for g in golds if g}, key=len, reverse=True)
  spans, i = [], 0
  while i < len(low):
    hit = None
    for p in pats:
      j = low.find(p, i)
      if j >= 0 and (hit is None or j < hit[0] or (j == hit[0] and j + len(p) > hit[1])):
        hit = (j, j + len(p))
    if hit is None:
      break
    spans.append(hit)
    i = hit[1]
  return [(src[a], src[b - 1] + 1) for a, b in spans]


def present(text: Optional[str], golds: Sequence[str]) -> bool:
  """SPEC §8.1 present(): some gold is a case-insensitive substring of text (the same
  match as `occurrences`, so present() is True exactly when `remove` has a span)."""
  return text is not None and bool(occurrences(text, golds))


def present_normalized(text: Optional[str], golds: Sequence[str]) -> bool:
  """Companion presence after SQuAD normalisation (lower, no punctuation, no articles),
  as whole normalised words; reported beside present(), which drives the edits."""
  if text is None:
    return False
  t = f' {normalize_answer(text)} '
  return any(normalize_answer(g) and f' {normalize_answer(g)} ' in t for g in golds)


def _replace(text: str, spans: Sequence[tuple[int, int]], sentinel: str) -> str:
  out, last = [], 0
  for a, b in sorted(spans):
    out += [text[last:a], sentinel]
    last = b
  out.append(text[last:])
  return ''.join(out)


def remove(text: str, golds: Sequence[str], sentinel: str = DEFAULT_SENTINEL) -> str:
  """Every gold occurrence → one sentinel.

  The result can still contain a gold when the sentinel spells it or forms it
  with a neighbour (gold 'mask', sentinel '[MASK]'); `edit_rows` flags such rows
  (`residual`) so they are counted, never hidden.
  """
  return _replace(text, occurrences(text, golds), sentinel)


def placebo_spans(text: str, golds: Sequence[str], id_: Hashable,
                  seed: int = PLACEBO_SEED) -> list[tuple[int, int]]:
  """Random disjoint word spans, one per gold occurrence with its word count,
  never overlapping a gold occurrence; rng seeded by (seed, crc32(str(id)))."""
  occ = occurrences(text, golds)
  words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
  rng = placebo_rng(id_, seed)
  taken: list[tuple[int, int]] = []
  for a, b in occ:
    w = max(1, len(text[a:b].split()))
    cands = []
    for k in range(len(words) - w + 1):
      s, e = words[k][0], words[k + w - 1][1]
      if not any(s < y and x < e for x, y in occ + taken):
        cands.append((s, e))
    if not cands:
      break
    taken.append(cands[int(rng.integers(len(cands)))])
  return sorted(taken)


def placebo_rng(id_: Hashable, seed: int = PLACEBO_SEED) -> np.random.Generator:
  """The placebo rng of one record: (seed, crc32(str(id))), independent of row order."""
  return np.random.default_rng([seed, zlib.crc32(str(id_).encode())])


def placebo(text: str, golds: Sequence[str], id_: Hashable,
            sentinel: str = DEFAULT_SENTINEL, seed: int = PLACEBO_SEED) -> tuple[str, int]:
  """(edited text, number of spans replaced) — see placebo_spans."""
  spans = placebo_spans(text, golds, id_, seed)
  return _replace(text, spans, sentinel), len(spans)


def insert_prepend(text: str, gold: str) -> str:
  """'Note: ⟨g⟩. ' + c."""
  return f'Note: {gold}. {text}'


def insert_mid(text: str, gold: str) -> tuple[str, bool]:
  """'⟨g⟩.' at the inner sentence boundary nearest the midpoint; (text, appended_flag)."""
  cuts = [m.end() for m in _BOUNDARY.finditer(text) if 0 < m.end() < len(text)]
  if not cuts:
    return f'{text.rstrip()} {gold}.', True
  mid = len(text) / 2
  at = min(cuts, key=lambda c: (abs(c - mid), c))
  return f'{text[:at]}{gold}. {text[at:]}', False


def default_prompt(context: str, question: str) -> str:
  """The 'Context: … Question: …? Answer:' layout of the pretrained readers."""
  q = question.strip().rstrip('?').rstrip()
  return f'Context: {context.strip()}\nQuestion: {q}?\nAnswer:'


def first_line(text: str) -> str:
  """The answer part of a generation: its first line, stripped."""
  return text.strip().split('\n')[0].strip()


# ---------------------------------------------------------------- media
@dataclasses.dataclass(frozen=True)
class TextMedium:
  """Contexts and golds are strings; the reader answers text prompts.

  The protocol every medium implements (ATRMedium likewise): check, present,
  present_companion, occurrences, remove, placebo, insert_prepend, insert_mid,
  for_panel, prompt, generate_kwargs, score, answer_text, sentinels.
  """
  prompt_fn: Callable[[str, Any], Any] = default_prompt  # (context, question) -> reader item
  max_new_tokens: int = 16  # reader's greedy budget
  stop: tuple = ('\n',)  # stop strings
  max_context_chars: Optional[int] = None  # a gold-less context whose insert exceeds this is skipped
  answer_fn: Callable[[str], str] = first_line  # generation text -> the scored answer
  sentinels: Any = dataclasses.field(default_factory=lambda: dict(TEXT_SENTINELS))

  def check(self, r: Record) -> Optional[str]:
    """The skip reason of a record (SKIP_REASONS), or None when usable."""
    if not r.golds or any(not isinstance(g, str) or len(g.strip()) < 2 for g in r.golds):
      return 'gold_too_short'
    if not isinstance(r.context, str) or not r.context.strip():
      return 'empty_context'
    if (self.max_context_chars is not None and not present(r.context, r.golds)
        and len(insert_prepend(r.context, r.golds[0])) > self.max_context_chars):
      return 'cannot_hold_insert'
    return None

  present = staticmethod(present)
  occurrences = staticmethod(occurrences)

  def present_companion(self, x: Optional[str], r: Record) -> bool:
    """Reported beside present(): SQuAD-normalised whole-word match."""
    return present_normalized(x, r.golds)

  def remove(self, x, golds, sentinel=DEFAULT_SENTINEL):
    return remove(x, golds, sentinel)

  def placebo(self, x, golds, id_, sentinel=DEFAULT_SENTINEL):
    return placebo(x, golds, id_, sentinel)

  def insert_prepend(self, x, gold):
    return insert_prepend(x, gold)

  def insert_mid(self, x, gold):
    return insert_mid(x, gold)

  def for_panel(self) -> 'TextMedium':
    return self  # text sentinels need no padding: lengths are free

  def prompt(self, r: Record, context: str) -> Any:
    return self.prompt_fn(context, r.question)

  def generate_kwargs(self) -> dict:
    return dict(max_new_tokens=self.max_new_tokens, stop=self.stop)

  def answer_text(self, generation) -> str:
    return self.answer_fn(generation.text)

  def score(self, generation, golds) -> float:
    """Token F1 × 100 (SQuAD normalisation) of the answer against the golds."""
    return 100.0 * token_f1(self.answer_text(generation), list(golds))


TEXT = TextMedium()


# ---------------------------------------------------------------- records
@dataclasses.dataclass
class Validation:
  """Records kept and a count of skipped ones per reason."""
  kept: list  # the valid Records, input order
  skipped: collections.Counter  # reason -> count
  skipped_ids: dict  # reason -> list of ids


def validate(records: Sequence[Record], max_context_chars: Optional[int] = None,
             medium: Any = None) -> Validation:
  """Split records into usable ones and counted skips (issue #16, acceptance 6).

  Reasons: 'gold_too_short' (some gold < 2 characters, or no gold),
  'empty_context', 'cannot_hold_insert' (text: the compiled context plus the
  insert would exceed max_context_chars; ATR: no free line slot for it).
  """
  if medium is None:
    medium = TextMedium(max_context_chars=max_context_chars)
  kept, skipped, ids = [], collections.Counter(), collections.defaultdict(list)
  for r in records:
    reason = medium.check(r)
    if reason:
      skipped[reason] += 1
      ids[reason].append(r.id)
    else:
      kept.append(r)
  return Validation(kept, skipped, dict(ids))


def bucket(record: Record, medium: Any = TEXT, companion: bool = False) -> str:
  """'raw→compiled' presence bucket, e.g. '1→0' (companion: the medium's second presence
  rule — SQuAD-normalised words on text, 'evidence line present' on ATR)."""
  raw = record.raw_context if record.raw_context is not None else record.context
  if companion:
    return (f'{int(medium.present_companion(raw, record))}→'
            f'{int(medium.present_companion(record.context, record))}')
  return f'{int(medium.present(raw, record.golds))}→{int(medium.present(record.context, record.golds))}'


def bucket_normalized(record: Record) -> str:
  """bucket() with present_normalized() (text)."""
  return bucket(record, TEXT, companion=True)


def bucket_counts(records: Sequence[Record], normalized: bool = False, medium: Any = TEXT) -> dict:
  """Rows per bucket (every record lands in exactly one)."""
  c = collections.Counter(bucket(r, medium, companion=normalized) for r in records)
  return {b: c.get(b, 0) for b in BUCKETS}


# ---------------------------------------------------------------- scoring
class Scorer:
  """Scores (record, context) pairs with a reader; identical prompts are answered once.

  `__call__(records, contexts)` -> F1 × 100 [n] (and gold log-likelihoods [n]
  when `loglik`). Greedy decoding is deterministic, so a repeated (id, context)
  is looked up; `fresh=True` bypasses the cache (the identity re-run, which is
  also sent in reverse order so that it shares no batch with the first run).
  """

  def __init__(self, reader, medium: Any = TEXT, loglik: bool = False):
    self.reader, self.medium, self.loglik = reader, medium, loglik
    self.cache: dict = {}  # (id, context) -> (f1, loglik or None, answer text)
    self.calls = 0  # reader items actually generated

  @staticmethod
  def _key(r: Record, context) -> tuple:
    return (r.id, context if isinstance(context, str) else tuple(context))

  def _run(self, recs, ctxs) -> list[tuple]:
    m = self.medium
    prompts = [m.prompt(r, c) for r, c in zip(recs, ctxs)]
    ids = [r.id for r in recs]
    gens = self.reader.generate(prompts, ids=ids, **m.generate_kwargs())
    self.calls += len(prompts)
    ll = (self.reader.loglik(prompts, [r.golds[0] for r in recs], ids=ids) if self.loglik
          else [None] * len(recs))
    return [(float(m.score(g, r.golds)), None if l is None else float(l), m.answer_text(g))
            for g, r, l in zip(gens, recs, ll)]

  def results(self, records: Sequence[Record], contexts: Sequence, fresh: bool = False
              ) -> list[tuple]:
    """(f1, loglik, answer) per (record, context)."""
    if fresh:
      order = list(range(len(records)))[::-1]
      out = self._run([records[k] for k in order], [contexts[k] for k in order]) if order else []
      res = [None] * len(records)
      for k, x in zip(order, out):
        res[k] = x
      return res
    keys = [self._key(r, c) for r, c in zip(records, contexts)]
    todo, seen = [], set()
    for k, (key, r, c) in enumerate(zip(keys, records, contexts)):
      if key not in self.cache and key not in seen:
        seen.add(key)
        todo.append(k)
    # one reader call per batch of distinct items: ids must be unique within a call
    while todo:
      batch, ids = [], set()
      rest = []
      for k in todo:
        (batch if records[k].id not in ids else rest).append(k)
        ids.add(records[k].id)
      for k, x in zip(batch, self._run([records[k] for k in batch],
                                       [contexts[k] for k in batch])):
        self.cache[keys[k]] = x
      todo = rest
    return [self.cache[k] for k in keys]

  def __call__(self, records: Sequence[Record], contexts: Sequence, fresh: bool = False):
    res = self.results(records, contexts, fresh)
    f1 = np.asarray([x[0] for x in res], np.float64)
    ll = np.asarray([x[1] for x in res], np.float64) if self.loglik else None
    return f1, ll


# ---------------------------------------------------------------- the audit
def edit_rows(records: Sequence[Record], sentinel: Any = None, medium: Any = TEXT) -> list[dict]:
  """The edited contexts: one dict per (record, applicable edit), without scores."""
  m = medium
  sentinel = m.sentinels['[MASK]'] if sentinel is None else sentinel
  rows = []
  for r in records:
    b = bucket(r, m)
    if m.present(r.context, r.golds):
      txt = m.remove(r.context, r.golds, sentinel)
      rows.append(dict(id=r.id, bucket=b, edit='remove', context=txt, placebo_spans=None,
                       appended=False, residual=m.present(txt, r.golds)))
      txt, k = m.placebo(r.context, r.golds, r.id, sentinel)
      if k:
        rows.append(dict(id=r.id, bucket=b, edit='placebo', context=txt, placebo_spans=k,
                         appended=False, residual=False))
    else:
      rows.append(dict(id=r.id, bucket=b, edit='insert_prepend',
                       context=m.insert_prepend(r.context, r.golds[0]), placebo_spans=None,
                       appended=False, residual=False))
      txt, flag = m.insert_mid(r.context, r.golds[0])
      rows.append(dict(id=r.id, bucket=b, edit='insert_mid', context=txt, placebo_spans=None,
                       appended=flag, residual=False))
  return rows


def run_audit(reader, records: Sequence[Record], *, sentinel: Any = None, identity: bool = True,
              medium: Any = None, scorer: Optional[Scorer] = None, loglik: bool = False,
              **text_kwargs) -> list[dict]:
  """Score every record unedited and under every applicable edit.

  Returns rows {id, bucket, edit, context, f1_orig, f1_edit, delta, answer,
  placebo_spans, appended, residual} (+ ll_orig, ll_edit, dll with loglik);
  edit 'identity' (a fresh re-run on the unchanged context) when identity.
  `scorer` shares answers across calls (same reader and medium).
  """
  if scorer is None:
    medium = medium or (TextMedium(**text_kwargs) if text_kwargs else TEXT)
    scorer = Scorer(reader, medium, loglik=loglik)
  m = scorer.medium
  base = scorer.results(records, [r.context for r in records])
  by_id = {r.id: (r, x) for r, x in zip(records, base)}
  rows = edit_rows(records, sentinel, m)
  scored = scorer.results([by_id[x['id']][0] for x in rows], [x['context'] for x in rows])
  if identity:
    ident = scorer.results(records, [r.context for r in records], fresh=True)
    rows += [dict(id=r.id, bucket=bucket(r, m), edit='identity', context=r.context,
                  placebo_spans=None, appended=False, residual=False) for r in records]
    scored += ident
  out = []
  for x, (fe, le, ans) in zip(rows, scored):
    fo, lo = by_id[x['id']][1][:2]
    row = dict(x, f1_orig=fo, f1_edit=fe, delta=fe - fo, answer=ans)
    if scorer.loglik:
      row.update(ll_orig=lo, ll_edit=le, dll=le - lo)
    out.append(row)
  return out


def effects(rows: Sequence[dict], *, seed: int = CI_SEED) -> list[dict]:
  """Per (edit, bucket): n, mean F1 of the edited arm, mean Δ with paired CI (and Δ log-lik)."""
  groups = collections.defaultdict(list)
  for x in rows:
    groups[(x['edit'], x['bucket'])].append(x)
  out = []
  for (e, b), xs in sorted(groups.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1])):
    fe = np.array([x['f1_edit'] for x in xs])
    fo = np.array([x['f1_orig'] for x in xs])
    d = dict(edit=e, bucket=b, n=len(xs), f1=mean_ci(fe, seed=seed),
             f1_orig=mean_ci(fo, seed=seed), delta=paired_difference_ci(fe, fo, seed=seed))
    if 'dll' in xs[0]:
      d['dll'] = mean_ci(np.array([x['dll'] for x in xs]), seed=seed)
    out.append(d)
  return out


def _order(edit: str) -> int:
  return (EDITS + ('identity',)).index(edit) if edit in EDITS + ('identity',) else 99


def _causal_pairs(rows: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(Δremove, Δplacebo) of the 1→1 items that have both edits, in the same order."""
  rem = {x['id']: x[key] for x in rows if x['bucket'] == '1→1' and x['edit'] == 'remove'}
  pla = {x['id']: x[key] for x in rows if x['bucket'] == '1→1' and x['edit'] == 'placebo'}
  both = [i for i in rem if i in pla]
  return np.array([rem[i] for i in both]), np.array([pla[i] for i in both])


def delta_causal(rows: Sequence[dict], *, seed: int = CI_SEED, key: str = 'delta') -> Aggregate:
  """Mean over 1→1 items with both remove and placebo of Δremove − Δplacebo (paired CI).

  key='dll': the same contrast on the gold log-likelihood change.
  """
  return metric_summary.delta_causal(*_causal_pairs(rows, key), seed=seed)


def delta_causal_parts(rows: Sequence[dict], *, seed: int = CI_SEED, key: str = 'delta'
                       ) -> dict[str, Aggregate]:
  """{'remove', 'placebo'}: mean Δremove and mean Δplacebo over Δcausal's own items (the
  1→1 items with both edits; seed 001's Table 1 row), each with its CI; their difference
  is Δcausal's value."""
  rem, pla = _causal_pairs(rows, key)
  return dict(remove=mean_ci(rem, seed=seed), placebo=mean_ci(pla, seed=seed))


def fmt(a: Aggregate | None) -> str:
  """'+1.23 [+0.50, +2.00]', or '—' for an absent aggregate (`fmt_ci`, 2 digits, signed)."""
  return fmt_ci(a, 2, signed=True)


def effects_table(effect_rows: Sequence[dict], causal: Optional[Aggregate] = None) -> str:
  """Markdown table of effects (and Δcausal beneath it)."""
  ll = any('dll' in x for x in effect_rows)
  lines = ['| edit | bucket | n | F1 (orig) | F1 (edited) | Δ [95% CI] |' + (' Δ log-lik [95% CI] |' if ll else ''),
           '|---|---|---:|---:|---:|---|' + ('---|' if ll else '')]
  for x in effect_rows:
    lines.append(f"| {x['edit']} | {x['bucket']} | {x['n']} | {x['f1_orig'].value:.2f} | "
                 f"{x['f1'].value:.2f} | {fmt(x['delta'])} |"
                 + (f" {fmt(x['dll'])} |" if ll else ''))
  if causal is not None:
    lines.append('')
    lines.append(f'Δcausal (1→1, n={causal.n}): {fmt(causal)}')
  return '\n'.join(lines)
