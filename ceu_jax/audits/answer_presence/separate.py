"""World A with the answer string and the evidence apart (issue #33): `world='atr_separate'`.

In World A (atr_world) the gold VALUE token *is* the evidence, so 001's two
explanations of a rewriting gain — "the compile surfaces the answer string" and
"the compile surfaces better evidence" — make the same prediction there. This
variant adds rewriters and edits that pull them apart, on the same raw records
and the same trained readers (the ATR data is unchanged; so is every World A edit):

  B2    the ID line filter of atr_world without surfacing (p_surface = 0): the base.
  Bev   "surface evidence": B2, and where B2's compile lacks the evidence line,
        the full line "ID #q KEY k VALUE v* ." put into one free filler slot.
  Bval  "surface value": the same slot gets the bare gold instead,
        "NOTE v* w w w w ." (the slot's own filler words after the gold: the
        audit's insert line), without its (ID, KEY) binding.
        Bev and Bval draw the slot from the same rng (rewriter_seed, 'surface',
        id), with probability `atr.p_surface` (1.0 by default), so on every
        surfaced record they differ in exactly the surfaced line.
  unbind          on a compile holding the evidence line: the binding tokens of
                  every evidence line (the query's ID #q and KEY k; "ID #q KEY k
                  VALUE v ." → "ID [MASK] KEY [MASK] VALUE v .", the paraphrase
                  "KEY k OF #q IS v ." likewise) → the one-token sentinel [MASK];
                  the VALUE token and every other token stay.
  unbind_placebo  as many one-token windows → [MASK] at random positions of the
                  other lines (never on a gold occurrence), rng (1729, crc32(id)).
  remove          (atr_world, the main table's edit) every gold occurrence →
                  [MASK]: the region is the gold span only (width 0), nothing else.

Predictions (module doc of the job's report; docs/answer_presence.md):
  "the gain is the answer string": Bval helps as much as Bev (F1(Bev) − F1(Bval)
  ≈ 0 on surfaced records) and unbinding costs nothing (F1(unbind) −
  F1(unbind_placebo) ≈ 0) while removing the VALUE costs;
  "the gain is better evidence": Bev beats Bval and unbinding costs.
`hypothesis_claims` decides both by rule (ceu_jax.claims, paired bootstrap CIs
over the shared records, a band of EQUIV_REL × the reference effect: "≈ 0" = the CI
inside it, "clearly" = the CI beyond it; at most one of the two is supported).

The sentinel panel keeps atr_world's regions (the gold widened to 3 tokens inside
its line: it also deletes the 2 tokens before the gold, "k VALUE" or "#q IS");
`span_panel_f1` adds the panel's one-token sentinels at the gold span only.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ceu_jax import claims
from ceu_jax.audits.answer_presence import atr_world as aw
from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.metrics.resampling import mean_ci, paired_difference_ci

BASELINES = ('B1', 'B2', 'Bev', 'Bval')
SURFACE = {'Bev': 'evidence', 'Bval': 'value'}
EQUIV_REL = 0.25  # the band: ± this share of the reference effect (hypothesis_claims)
SPAN_SENTINELS = ('[MASK]', '[REMOVED]', 'word', 'symbol')  # the panel's one-token sentinels


# ---------------------------------------------------------------- rewriters
def surface(medium: aw.ATRMedium, r: ap.Record, base, kind: str, *, p_surface: float,
            seed: int) -> tuple[int, ...]:
  """`base` with the evidence line (kind 'evidence') or the bare gold (kind 'value')
  in one free filler slot, when `base` lacks r's evidence line (module doc)."""
  if kind not in ('evidence', 'value'):
    raise ValueError(f"kind must be 'evidence' or 'value', got {kind!r}")
  base = tuple(base)
  rng = aw.item_rng(seed, 'surface', r.id)  # shared by both kinds
  u = rng.random()
  lines = [tuple(l) for l in medium.lines(base)]
  free = [k for k, line in enumerate(lines) if medium.is_free(line)]
  if medium.evidence_lines(base, r) or not free or u >= p_surface:
    return base
  k = free[int(rng.integers(len(free)))]
  v, q, gold = medium.vocab, tuple(r.question), tuple(r.golds[0])
  if kind == 'evidence':
    lines[k] = (v.tok('ID'), q[2], v.tok('KEY'), q[4], v.tok('VALUE'), *gold, v.tok('.'))
  else:
    lines[k] = lines[k][:1] + gold + lines[k][1 + len(gold):]
  return medium.with_lines(base, lines)


def compiled(medium: aw.ATRMedium, raw: Sequence[ap.Record], *, p_drop: float, p_surface: float,
             seed: int) -> dict:
  """{baseline: records} for BASELINES (B1 = raw)."""
  base = aw.compiled_records(medium, raw, 'B2', p_drop=p_drop, p_surface=0.0, seed=seed)
  out = {'B1': list(raw), 'B2': base}
  for b, kind in SURFACE.items():
    out[b] = [dataclasses.replace(r, context=surface(medium, r, r.context, kind,
                                                     p_surface=p_surface, seed=seed))
              for r in base]
  return out


# ---------------------------------------------------------------- edits
def binding_positions(medium: aw.ATRMedium, x, r: ap.Record) -> list[int]:
  """Context positions of the query's ID and KEY tokens in every evidence line of x."""
  q = tuple(r.question)
  out = []
  for k in medium.evidence_lines(x, r):
    s = medium.line_starts()[k]
    line = tuple(x[s:s + medium.cfg.line_len])
    out += [s + line.index(q[2]), s + line.index(q[4])]  # both formats hold each once
  return sorted(out)


def _put(x, positions, token: int) -> tuple[int, ...]:
  out = list(x)
  for p in positions:
    out[p] = token
  return tuple(out)


def unbind(medium: aw.ATRMedium, x, r: ap.Record) -> tuple[int, ...]:
  """The evidence lines' binding tokens (ID #q, KEY k) → [MASK]; all else kept."""
  return _put(x, binding_positions(medium, x, r), medium.sentinels['[MASK]'][0])


def unbind_placebo_positions(medium: aw.ATRMedium, x, r: ap.Record) -> list[int]:
  """As many line positions as `binding_positions`, outside every evidence line and gold
  occurrence, drawn with the placebo rng (1729, crc32(id)): order-free."""
  n = len(binding_positions(medium, x, r))
  t, starts = medium.cfg.line_len, medium.line_starts()
  ev = set(medium.evidence_lines(x, r))
  gold = {p for a, b in medium.occurrences(x, r.golds) for p in range(a, b)}
  cands = [s + o for k, s in enumerate(starts) if k not in ev for o in range(t)
           if s + o not in gold]
  if len(cands) < n:
    return []
  rng = ap.placebo_rng(r.id)
  return sorted(int(p) for p in rng.choice(cands, size=n, replace=False))


def unbind_placebo(medium: aw.ATRMedium, x, r: ap.Record) -> tuple[int, ...]:
  return _put(x, unbind_placebo_positions(medium, x, r), medium.sentinels['[MASK]'][0])


def remove_span(medium: aw.ATRMedium, x, golds, sentinel) -> tuple[int, ...]:
  """Every gold occurrence → the sentinel padded with [FILL] inside it: the region is the
  gold span only (a sentinel longer than the span is refused, never widened)."""
  out = list(x)
  for a, b in medium.occurrences(x, golds):
    out[a:b] = medium.fill(sentinel, b - a)  # raises when it does not fit
  return tuple(out)


# ---------------------------------------------------------------- one chunk
def separation(scorer: ap.Scorer, by_baseline: dict) -> dict:
  """The separating contrasts of one chunk (JSON-able): per surfaced record F1 of B2, Bev
  and Bval; per B2 record holding the evidence line F1 of the compile, unbind, its
  placebo and remove; the one-token panel at the gold span."""
  m = scorer.medium
  base = {r.id: r for r in by_baseline['B2']}
  ev = {r.id: r for r in by_baseline['Bev']}
  val = {r.id: r for r in by_baseline['Bval']}
  surf = [i for i in base if ev[i].context != base[i].context]
  lacking = [i for i in base if not m.evidence_lines(base[i].context, base[i])]
  f = {b: scorer([d[i] for i in surf], [d[i].context for i in surf])[0]
       for b, d in (('B2', base), ('Bev', ev), ('Bval', val))}
  out = dict(surfaced=[dict(id=str(i), **{b: float(f[b][k]) for b in f})
                       for k, i in enumerate(surf)],
             not_surfaced=[str(i) for i in lacking if i not in set(surf)])
  holding = [r for r in by_baseline['B2'] if m.evidence_lines(r.context, r)
             and unbind_placebo_positions(m, r.context, r)]
  arms = {'orig': [r.context for r in holding],
          'unbind': [unbind(m, r.context, r) for r in holding],
          'unbind_placebo': [unbind_placebo(m, r.context, r) for r in holding],
          'remove': [m.remove(r.context, r.golds, m.sentinels['[MASK]']) for r in holding]}
  for s in SPAN_SENTINELS[1:]:
    arms[f'span {s}'] = [remove_span(m, r.context, r.golds, m.sentinels[s]) for r in holding]
  f = {a: scorer(holding, ctx)[0] for a, ctx in arms.items()}
  out['edits'] = [dict(id=str(r.id), **{a: float(f[a][k]) for a in arms})
                  for k, r in enumerate(holding)]
  return out


# ---------------------------------------------------------------- summary and claims
def _col(rows, key) -> np.ndarray:
  return np.asarray([x[key] for x in rows], np.float64)


def _band(d: claims.Difference, ref: float) -> tuple:
  """(the paired CI of d, the band ± EQUIV_REL × |ref|, its text) or None without items."""
  a = d.per_seed[0].diff
  if a.value is None:
    return None
  band = EQUIV_REL * abs(ref)
  return a, band, f'{ap.fmt(a)} vs ±{band:.2f} (= {EQUIV_REL:g} × {abs(ref):.2f})'


def _within(label: str, d: claims.Difference, ref: float) -> tuple[str, bool | None, str]:
  """'≈ 0': the paired 95% CI lies inside the band."""
  b = _band(d, ref)
  if b is None:
    return (label, None, 'no paired items')
  a, band, text = b
  return (label, bool(-band <= a.ci_low and a.ci_high <= band), text)


def _beyond(label: str, d: claims.Difference, ref: float, sign: int) -> tuple[str, bool | None, str]:
  """'clearly nonzero': the paired 95% CI lies beyond the band on the predicted side."""
  b = _band(d, ref)
  if b is None:
    return (label, None, 'no paired items')
  a, band, text = b
  return (label, bool(a.ci_low > band if sign > 0 else a.ci_high < -band), text)


def hypothesis_claims(name: str, sur: Sequence[dict], edits: Sequence[dict], *,
                      seed: int = ap.CI_SEED) -> list[claims.Claim]:
  """001's two explanations of the rewriting gain, each decided by rule on one reader.

  The band is EQUIV_REL × the reference effect (the evidence line's gain for Bev − Bval,
  the cost of removing the VALUE for unbind − placebo): 'answer string' needs both CIs
  inside it, 'better evidence' both beyond it on the predicted side, so at most one of
  the two is supported; a CI that straddles the band's edge supports neither.
  """
  b2, bev, bval = (_col(sur, k) for k in ('B2', 'Bev', 'Bval'))
  unb, pla, rem = (_col(edits, k) for k in ('unbind', 'unbind_placebo', 'remove'))
  gain_val = claims.paired('F1(Bval) − F1(B2)', [('run', bval, b2)], seed=seed)
  gain_ev = claims.paired('F1(Bev) − F1(B2)', [('run', bev, b2)], seed=seed)
  ev_val = claims.paired('F1(Bev) − F1(Bval)', [('run', bev, bval)], seed=seed)
  unbind_cost = claims.paired('F1(unbind) − F1(placebo)', [('run', unb, pla)], seed=seed)
  remove_cost = claims.paired('F1(remove) − F1(placebo)', [('run', rem, pla)], seed=seed)
  ref_ev, ref_rem = gain_ev.mean or 0.0, remove_cost.mean or 0.0
  answer = claims.combine(
      f'{name}: gain = answer string',
      'the bare gold helps as much as the evidence line, and removing the binding costs '
      'nothing while removing the VALUE costs',
      [('bare value helps', gain_val, +1), ('removing the VALUE costs', remove_cost, -1)],
      [_within('Bev − Bval inside the band', ev_val, ref_ev),
       _within('unbind − placebo inside the band', unbind_cost, ref_rem)])
  evidence = claims.combine(
      f'{name}: gain = better evidence',
      'the evidence line helps clearly more than the bare gold, and removing the binding '
      'clearly costs',
      [('evidence line beats bare value', ev_val, +1),
       ('removing the binding costs', unbind_cost, -1)],
      [_beyond('Bev − Bval above the band', ev_val, ref_ev, +1),
       _beyond('unbind − placebo below the band', unbind_cost, ref_rem, -1)])
  return [answer, evidence]


def reader_summary(name: str, parts: Sequence[dict], seed: int) -> dict:
  """The separation of one reader over its chunks (JSON-able)."""

  sur = [x for p in parts for x in p['separation']['surfaced']]
  edits = [x for p in parts for x in p['separation']['edits']]
  out: dict = dict(n_surfaced=len(sur), n_edits=len(edits),
                   not_surfaced=sum(len(p['separation']['not_surfaced']) for p in parts))

  def agg(a, b=None):
    if not len(a):
      return None
    return (mean_ci(a, seed=seed) if b is None else paired_difference_ci(a, b, seed=seed)).to_dict()
  s = {k: _col(sur, k) for k in ('B2', 'Bev', 'Bval')}
  out['surfaced'] = {**{k: agg(v) for k, v in s.items()},
                     'Bev − B2': agg(s['Bev'], s['B2']), 'Bval − B2': agg(s['Bval'], s['B2']),
                     'Bev − Bval': agg(s['Bev'], s['Bval'])}
  e = {k: _col(edits, k) for k in (edits[0] if edits else {}) if k != 'id'}
  out['edits'] = {k: agg(v) for k, v in e.items()}
  if edits:
    o = e['orig']
    out['edits'].update({
        'Δunbind': agg(e['unbind'], o), 'Δunbind_placebo': agg(e['unbind_placebo'], o),
        'Δremove': agg(e['remove'], o),
        'unbind − placebo': agg(e['unbind'], e['unbind_placebo']),
        'remove − placebo': agg(e['remove'], e['unbind_placebo'])})
    out['span_panel'] = {s: agg(e[f'span {s}'], e['remove']) for s in SPAN_SENTINELS[1:]}
  out['claims'] = [dataclasses.asdict(c) for c in hypothesis_claims(name, sur, edits, seed=seed)]
  return out
