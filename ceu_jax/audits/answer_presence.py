"""Answer-presence audit of a context rewriter (SPEC §8.1, seed 001).

A record is (id, question, gold answers, raw context C, compiled context c).
present(x, g) is a case-insensitive substring match of any gold in x, so
coincidental mentions count. The bucket is present(C)→present(c). Four edits of
c: remove (every gold occurrence → one sentinel), placebo (as many random
non-answer spans of the same word count → the sentinel, rng seeded by
(1729, crc32(id)) so rows are order-independent), insert_prepend and
insert_mid. Effects Δ = F1(edit) − F1(c) (token F1 × 100) with paired
bootstrap CIs (1000 resamples, seed 42); Δcausal = mean over 1→1 rows of
Δremove − Δplacebo. The sentinel panel and C2a/C2b rules live in
`ceu_jax.audits.sentinels`.

Bad input (a gold shorter than 2 characters, an empty context, a context too
long to hold an insert) is skipped with a counted reason, never silently.
No shapes: everything here is per-record Python over strings.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import zlib
from typing import Callable, Hashable, Mapping, Optional, Sequence

import numpy as np

from ceu_jax.metrics.resampling import Aggregate, mean_ci, paired_difference_ci
from ceu_jax.metrics.text import normalize_answer, token_f1

PLACEBO_SEED = 1729  # SPEC §8.1: placebo rng = (1729, crc32(id))
CI_SEED = 42  # SPEC §8: bootstrap seed
EDITS = ('remove', 'placebo', 'insert_prepend', 'insert_mid')
BUCKETS = ('0→0', '0→1', '1→1', '1→0')
DEFAULT_SENTINEL = '[MASK]'
_WORD = re.compile(r'\S+')
_BOUNDARY = re.compile(r'[.!?]\s+')


@dataclasses.dataclass(frozen=True)
class Record:
  """One audited question."""
  id: Hashable  # unique item id (seeds the placebo rng through crc32(str(id)))
  question: str  # the question q
  golds: tuple[str, ...]  # gold answers g (each ≥ 2 characters)
  context: str  # the processed (compiled) context c = R(C, q)
  raw_context: Optional[str] = None  # the raw retrieved context C (None: bucket uses c)


@dataclasses.dataclass
class Validation:
  """Records kept and a count of skipped ones per reason."""
  kept: list  # the valid Records, input order
  skipped: collections.Counter  # reason -> count
  skipped_ids: dict  # reason -> list of ids


def validate(records: Sequence[Record], max_context_chars: Optional[int] = None) -> Validation:
  """Split records into usable ones and counted skips (SPEC acceptance 6).

  Reasons: 'gold_too_short' (some gold < 2 characters, or no gold),
  'empty_context', 'cannot_hold_insert' (the compiled context plus the longest
  insert would exceed max_context_chars).
  """
  kept, skipped, ids = [], collections.Counter(), collections.defaultdict(list)
  for r in records:
    reason = None
    if not r.golds or any(len(g.strip()) < 2 for g in r.golds):
      reason = 'gold_too_short'
    elif not r.context.strip():
      reason = 'empty_context'
    elif (max_context_chars is not None and not present(r.context, r.golds)
          and len(insert_prepend(r.context, r.golds[0])) > max_context_chars):
      reason = 'cannot_hold_insert'
    if reason:
      skipped[reason] += 1
      ids[reason].append(r.id)
    else:
      kept.append(r)
  return Validation(kept, skipped, dict(ids))


def occurrences(text: str, golds: Sequence[str]) -> list[tuple[int, int]]:
  """Disjoint (start, end) spans of gold occurrences, leftmost then longest, case-insensitive."""
  low = text.lower()
  pats = sorted({g.lower() for g in golds if g}, key=len, reverse=True)
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
  return spans


def present(text: Optional[str], golds: Sequence[str]) -> bool:
  """SPEC §8.1 present(): some gold is a case-insensitive substring of text."""
  return text is not None and any(g and g.lower() in text.lower() for g in golds)


def present_normalized(text: Optional[str], golds: Sequence[str]) -> bool:
  """Companion presence after SQuAD normalisation (lower, no punctuation, no articles),
  as whole normalised words; reported beside present(), which drives the edits."""
  if text is None:
    return False
  t = f' {normalize_answer(text)} '
  return any(normalize_answer(g) and f' {normalize_answer(g)} ' in t for g in golds)


def bucket(record: Record) -> str:
  """'raw→compiled' presence bucket, e.g. '1→0'."""
  raw = record.raw_context if record.raw_context is not None else record.context
  return f'{int(present(raw, record.golds))}→{int(present(record.context, record.golds))}'


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
  rng = np.random.default_rng([seed, zlib.crc32(str(id_).encode())])
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


def answer_f1(reader, records: Sequence[Record], contexts: Sequence[str], *,
              prompt: Callable[[str, str], str] = default_prompt,
              max_new_tokens: int = 16, stop: Sequence = ('\n',)) -> np.ndarray:
  """Token F1 × 100 [n] of the reader's greedy answers on (context, question) vs the golds."""
  if not records:
    return np.zeros((0,), np.float64)
  gens = reader.generate([prompt(c, r.question) for r, c in zip(records, contexts)],
                         max_new_tokens=max_new_tokens, stop=stop, ids=[r.id for r in records])
  return np.asarray([100.0 * token_f1(g.text, list(r.golds)) for g, r in zip(gens, records)])


def edit_rows(records: Sequence[Record], sentinel: str = DEFAULT_SENTINEL) -> list[dict]:
  """The edited contexts: one dict per (record, applicable edit), without scores."""
  rows = []
  for r in records:
    b = bucket(r)
    if present(r.context, r.golds):
      txt = remove(r.context, r.golds, sentinel)
      rows.append(dict(id=r.id, bucket=b, edit='remove', context=txt, placebo_spans=None,
                       appended=False, residual=present(txt, r.golds)))
      txt, k = placebo(r.context, r.golds, r.id, sentinel)
      if k:
        rows.append(dict(id=r.id, bucket=b, edit='placebo', context=txt, placebo_spans=k,
                         appended=False, residual=False))
    else:
      rows.append(dict(id=r.id, bucket=b, edit='insert_prepend',
                       context=insert_prepend(r.context, r.golds[0]), placebo_spans=None,
                       appended=False, residual=False))
      txt, flag = insert_mid(r.context, r.golds[0])
      rows.append(dict(id=r.id, bucket=b, edit='insert_mid', context=txt, placebo_spans=None,
                       appended=flag, residual=False))
  return rows


def run_audit(reader, records: Sequence[Record], *, sentinel: str = DEFAULT_SENTINEL,
              identity: bool = True, **score_kwargs) -> list[dict]:
  """Score every record unedited and under every applicable edit.

  Returns rows {id, bucket, edit, f1_orig, f1_edit, delta, placebo_spans,
  appended, residual}; edit 'identity' (re-run on the unchanged context) when identity.
  """
  base = answer_f1(reader, records, [r.context for r in records], **score_kwargs)
  by_id = {r.id: (r, f) for r, f in zip(records, base)}
  rows = edit_rows(records, sentinel)
  if identity:
    rows += [dict(id=r.id, bucket=bucket(r), edit='identity', context=r.context,
                  placebo_spans=None, appended=False, residual=False) for r in records]
  # One reader call per edit: item ids stay unique within a call (Reader contract).
  f = np.zeros((len(rows),), np.float64)
  for e in {x['edit'] for x in rows}:
    at = [k for k, x in enumerate(rows) if x['edit'] == e]
    f[at] = answer_f1(reader, [by_id[rows[k]['id']][0] for k in at],
                      [rows[k]['context'] for k in at], **score_kwargs)
  out = []
  for x, fe in zip(rows, f):
    fo = float(by_id[x['id']][1])
    out.append(dict(x, f1_orig=fo, f1_edit=float(fe), delta=float(fe) - fo))
  return out


def effects(rows: Sequence[dict], *, seed: int = CI_SEED) -> list[dict]:
  """Per (edit, bucket): n, mean F1 of the edited arm and mean Δ with paired CI."""
  groups = collections.defaultdict(list)
  for x in rows:
    groups[(x['edit'], x['bucket'])].append(x)
  out = []
  for (e, b), xs in sorted(groups.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1])):
    fe = np.array([x['f1_edit'] for x in xs])
    fo = np.array([x['f1_orig'] for x in xs])
    out.append(dict(edit=e, bucket=b, n=len(xs), f1=mean_ci(fe, seed=seed),
                    delta=paired_difference_ci(fe, fo, seed=seed)))
  return out


def _order(edit: str) -> int:
  return (EDITS + ('identity',)).index(edit) if edit in EDITS + ('identity',) else 99


def delta_causal(rows: Sequence[dict], *, seed: int = CI_SEED) -> Aggregate:
  """Mean over 1→1 items with both remove and placebo of Δremove − Δplacebo (paired CI)."""
  rem = {x['id']: x['delta'] for x in rows if x['bucket'] == '1→1' and x['edit'] == 'remove'}
  pla = {x['id']: x['delta'] for x in rows if x['bucket'] == '1→1' and x['edit'] == 'placebo'}
  both = [i for i in rem if i in pla]
  return paired_difference_ci(np.array([rem[i] for i in both]),
                              np.array([pla[i] for i in both]), seed=seed)


def _fmt(a: Aggregate) -> str:
  if a.value is None:
    return '—'
  return f'{a.value:+.2f} [{a.ci_low:+.2f}, {a.ci_high:+.2f}]'


def effects_table(effect_rows: Sequence[dict], causal: Optional[Aggregate] = None) -> str:
  """Markdown table of effects (and Δcausal beneath it)."""
  lines = ['| edit | bucket | n | F1 (edited) | Δ [95% CI] |', '|---|---|---:|---:|---|']
  for x in effect_rows:
    lines.append(f"| {x['edit']} | {x['bucket']} | {x['n']} | {x['f1'].value:.2f} | "
                 f"{_fmt(x['delta'])} |")
  if causal is not None:
    lines.append('')
    lines.append(f'Δcausal (1→1, n={causal.n}): {_fmt(causal)}')
  return '\n'.join(lines)


def bucket_normalized(record: Record) -> str:
  """bucket() with present_normalized()."""
  raw = record.raw_context if record.raw_context is not None else record.context
  return (f'{int(present_normalized(raw, record.golds))}→'
          f'{int(present_normalized(record.context, record.golds))}')


def bucket_counts(records: Sequence[Record], normalized: bool = False) -> dict:
  """Rows per bucket (every record lands in exactly one)."""
  c = collections.Counter((bucket_normalized if normalized else bucket)(r) for r in records)
  return {b: c.get(b, 0) for b in BUCKETS}
