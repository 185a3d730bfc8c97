"""SPEC §8.4 on SmolLM2 (World B of the companion audits): a position probe at the answer /
decision with the intermediate output held fixed, as a layer profile at every read port.

A world builds one `ProbePair` per item: D+ and D− token ids that differ only in the input
(the problem or the checklist's statements), the same teacher-forced intermediate output
and the same answer (its last `answer_len` tokens, scored). Then
  ΔL = L+ − L− = log p(y | D+) − log p(y | D−): the direct X → Y path that bypasses the
       intermediate output (≈ 0 for a reader that answers from it);
  CEU_<probe>(ℓ) = restoration of L by patching layer ℓ's read port (`layers_ℓ/attn:read`,
       the attention read) at the positions that predict the answer, from D+ into D− —
       the whole read, or only its part read from a span of the input (Π_S);
all layers in one compiled call per batch (`pretrained.patching.fast_patch_audit`, tested
against the engine's record / patch). CEU is the engine's stabilised score over
non-degenerate items (ΔL ≥ ε); means with 95% percentile-bootstrap CIs over items, overall
and per stratum. Used by `traces.smollm2_probe` and `mediator.smollm2_probe`.

Claims (`pair_claims`, issue #35 item 4) for a shortcut reader beside its faithful /
following counterpart: `probe separates` — ΔL(shortcut) − ΔL(faithful), paired by item,
CI above 0 (PROBE_RULE); `probe agrees` — the probe and the behavioural audit's `separates`
reach the same verdict (AGREE_RULE).

Shape legend: B items per batch, T tokens (left-padded), T_in = T − 1 reader positions,
Q probes, L layers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ceu_jax import claims, engine
from ceu_jax.metrics.resampling import fmt_ci, mean_ci, paired_difference_ci


@dataclasses.dataclass(frozen=True)
class ProbePair:
  """One item: D+ / D− ids of equal length, the answer's token count (the last tokens) and,
  per probe, the span of the input its patch is restricted to (None: the whole read);
  `scored` picks the answer tokens that are scored and whose predicting positions are
  patched (None: all of them; the others stay teacher-forced, e.g. the names in a tool
  argument that names its entities)."""
  id: str
  plus: tuple[int, ...]
  minus: tuple[int, ...]
  answer_len: int
  spans: tuple[Optional[tuple[bool, ...]], ...]   # per probe, over the ids (True: in S)
  scored: Optional[tuple[bool, ...]] = None       # [answer_len] (None: every answer token)

  def problem(self) -> Optional[str]:
    """What makes the pair unusable (None: token-aligned and differing inside every span
    only)."""
    if len(self.plus) != len(self.minus):
      return f'item {self.id}: D+ and D− are not token-aligned'
    diff = [a != b for a, b in zip(self.plus, self.minus)]
    if not any(diff):
      return f'item {self.id}: D+ and D− are the same'
    if self.scored is not None and (len(self.scored) != self.answer_len or not any(self.scored)):
      return (f'item {self.id}: `scored` must flag {self.answer_len} answer tokens, at least '
              'one of them True')
    tail = len(diff) - self.answer_len
    scored = (True,) * self.answer_len if self.scored is None else self.scored
    if any(s and (diff[tail + i] or diff[tail + i - 1]) for i, s in enumerate(scored)):
      # a scored token and the position that predicts it (patched) are the same in D±; an
      # unscored answer token (forced) may differ, as the forced output before it may
      return f'item {self.id}: D+ and D− differ in the forced output or answer'
    for s in self.spans:
      if s is not None and any(d and not x for d, x in zip(diff, s)):
        return f'item {self.id}: D+ and D− differ outside a probe\'s span'
    return None

  def check(self) -> None:
    """AssertionError naming the `problem`, if any."""
    problem = self.problem()
    if problem:
      raise AssertionError(problem)


def _batch(pairs: Sequence[ProbePair], t: int) -> tuple[dict, dict, np.ndarray]:
  """(clean, corrupt) engine inputs [B, T] (left-padded) and spans [Q, B, T_in]."""
  from ceu_jax.pretrained.tokenizer import PAD_ID
  b, q = len(pairs), len(pairs[0].spans)
  arr = {k: np.full((b, t), PAD_ID, np.int32) for k in ('plus', 'minus')}
  valid, answer = np.zeros((b, t), bool), np.zeros((b, t), bool)
  span = np.ones((q, b, t - 1), bool)
  for i, p in enumerate(pairs):
    off = t - len(p.plus)
    arr['plus'][i, off:], arr['minus'][i, off:] = p.plus, p.minus
    valid[i, off:] = True
    answer[i, t - p.answer_len:] = True if p.scored is None else p.scored
    for j, s in enumerate(p.spans):
      if s is not None:
        span[j, i] = False
        span[j, i, off:] = np.asarray(s[:-1], bool)
  inp = lambda k: {'tokens': arr[k], 'valid': valid, 'answer_mask': answer}  # noqa: E731
  return inp('plus'), inp('minus'), span


def per_item(params: dict, model_config, pairs: Sequence[ProbePair], names: Sequence[str], *,
             eps: float = engine.scores.DEFAULT_EPS, batch_size: int = 8,
             progress: Optional[Callable[[int, int], None]] = None) -> dict:
  """Per-item numbers: {ids, layers, L_plus, L_minus, delta_L, degenerate [n], ceu
  {probe: [L, n]}, L_int {probe: [L, n]}}; one compiled shape (the last batch is filled with
  repeats of its last item, dropped from the results)."""
  from ceu_jax.pretrained.patching import answer_positions, fast_patch_audit
  out = dict(ids=[p.id for p in pairs], layers=int(model_config.n_layers))
  if not pairs:
    return out
  for p in pairs:
    p.check()
    if len(p.spans) != len(names):
      raise ValueError(f'item {p.id}: {len(p.spans)} spans for {len(names)} probes')
  t = max(len(p.plus) for p in pairs)
  n_tail = max(p.answer_len for p in pairs)
  cols: dict = {k: [] for k in ('L_plus', 'L_minus', 'delta_L', 'degenerate')}
  ceu: dict = {q: [] for q in names}
  lint: dict = {q: [] for q in names}
  for lo in range(0, len(pairs), batch_size):
    chunk = list(pairs[lo:lo + batch_size])
    real = len(chunk)
    chunk += [chunk[-1]] * (batch_size - real)
    clean, corrupt, span = _batch(chunk, t)
    pos = answer_positions(clean['answer_mask'])                       # [B, T_in]
    probes = engine.Probes(span=span, positions=np.broadcast_to(pos, span.shape).copy(),
                           names=tuple(names))
    prof = fast_patch_audit({'params': params}, model_config, clean=clean, corrupt=corrupt,
                            probes=probes, n_tail=n_tail, eps=eps)
    r0 = prof.results[0]
    for k, v in (('L_plus', r0.L_plus), ('L_minus', r0.L_minus), ('delta_L', r0.delta_L),
                 ('degenerate', r0.degenerate)):
      cols[k].append(np.asarray(v)[:real])
    for q in names:
      ceu[q].append(np.stack([np.asarray(r.ceu_of(q))[:real] for r in prof.results]))
      lint[q].append(np.stack([np.asarray(r.L_int_of(q))[:real] for r in prof.results]))
    if progress is not None:
      progress(min(lo + batch_size, len(pairs)), len(pairs))
  out.update({k: np.concatenate(v).tolist() for k, v in cols.items()})
  out['ceu'] = {q: np.concatenate(v, axis=1).tolist() for q, v in ceu.items()}
  out['L_int'] = {q: np.concatenate(v, axis=1).tolist() for q, v in lint.items()}
  return out


def summarize(items: Mapping[str, Any], strata: Optional[Mapping[str, str]] = None, *,
              seed: int = 42) -> dict:
  """ΔL and per-layer CEU of every probe (non-degenerate items), overall and per stratum:
  {n, n_degenerate, delta_L, layers: [{layer, ceu_<probe>}], by_stratum, delta_L_by_item,
  stratum_by_item, skipped}."""
  ids = list(items['ids'])
  names = list(items.get('ceu', {}))

  def part(keep: np.ndarray) -> dict:
    dl = np.asarray(items['delta_L'], np.float64)[keep]
    deg = np.asarray(items['degenerate'], bool)[keep]
    layers = []
    for layer in range(int(items['layers'])):
      row: dict = {'layer': layer}
      for q in names:
        v = np.asarray(items['ceu'][q][layer], np.float64)[keep][~deg]
        row[f'ceu_{q}'] = mean_ci(v, seed=seed).to_dict()
      layers.append(row)
    return dict(n=int(dl.size), n_degenerate=int(deg.sum()),
                delta_L=mean_ci(dl, seed=seed).to_dict(), layers=layers)

  skipped = dict(items.get('skipped', {}))
  if not ids:
    return dict(n=0, n_degenerate=0, delta_L=mean_ci(np.zeros(0)).to_dict(), layers=[],
                by_stratum={}, skipped=skipped, delta_L_by_item={}, stratum_by_item={})
  out = part(np.ones(len(ids), bool))
  out['skipped'] = skipped
  out['delta_L_by_item'] = {i: float(v) for i, v in zip(ids, items['delta_L'])}
  out['stratum_by_item'] = {i: strata.get(i) for i in ids} if strata else {}
  out['by_stratum'] = {}
  for st in sorted({strata[i] for i in ids if strata and strata.get(i)}):
    out['by_stratum'][st] = part(np.asarray([strata.get(i) == st for i in ids]))
  return out


def peak(summary: dict, key: str) -> Optional[dict]:
  """The layer row whose `key` mean is largest (None without non-degenerate items)."""
  rows = [x for x in summary.get('layers', []) if x[key]['value'] is not None]
  return max(rows, key=lambda x: x[key]['value']) if rows else None


def table(probes: Mapping[str, dict], names: Sequence[str], unit: str = 'items') -> str:
  """Markdown: per reader and stratum, ΔL, the layer where the first probe's CEU peaks with
  every probe's CEU there, and each other probe's own peak."""
  from ceu_jax.metrics.resampling import fmt_ci
  fmt = lambda a: fmt_ci(a or None)  # noqa: E731
  first, rest = f'ceu_{names[0]}', [f'ceu_{q}' for q in names[1:]]
  head = [f'CEU_{names[0]} peak: layer, value [95% CI] (n)']
  for q in rest:
    head += [f'CEU_{q[4:]} there', f'CEU_{q[4:]} peak']
  lines = [f'| reader | {unit} | n | degenerate | ΔL (nats) [95% CI] | ' + ' | '.join(head)
           + ' |', '|---|---|---:|---:|---|---|' + '---|---|' * len(rest)]
  for r, p in probes.items():
    for st, c in [('all', p)] + sorted(p.get('by_stratum', {}).items()):
      a = peak(c, first)
      cells = ['—' if a is None else f"{a['layer']}: {fmt(a[first])} ({a[first]['n']})"]
      for q in rest:
        b = peak(c, q)
        cells += ['—' if a is None else fmt(a[q]),
                  '—' if b is None else f"{b['layer']}: {fmt(b[q])}"]
      lines.append(f"| {r} | {st} | {c['n']} | {c['n_degenerate']} | {fmt(c['delta_L'])} | "
                   + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def layer_figure(probes: Mapping[str, dict], names: Sequence[str], titles: Sequence[str],
                 stem: str, title: str) -> list[str]:
  """CEU of each probe (one panel each, 95% CI bands) against layer: colour = reader, line
  style = stratum (solid: all items)."""
  from matplotlib.figure import Figure
  from ceu_jax import plotting
  fig = Figure(figsize=(5.0 * len(names), 3.8))
  axes = np.atleast_1d(fig.subplots(1, len(names), sharey=True))
  styles = {'all': '-', 'memorised': '--', 'fresh': ':'}
  for ax, q, sub in zip(axes, names, titles):
    for i, (r, p) in enumerate(probes.items()):
      for st, c in [('all', p)] + sorted(p.get('by_stratum', {}).items()):
        pts = [(x['layer'], x[f'ceu_{q}']) for x in c.get('layers', [])
               if x[f'ceu_{q}']['value'] is not None]
        if not pts:
          continue
        xs = [L for L, _ in pts]
        used = f" (CEU over {c['n'] - c['n_degenerate']} of {c['n']})" if 'n' in c else ''
        ax.plot(xs, [a['value'] for _, a in pts], color=f'C{i}', ls=styles.get(st, '-.'),
                lw=1.3, label=f'{r}' + ('' if st == 'all' else f' [{st}]') + used)
        ax.fill_between(xs, [a['ci_low'] for _, a in pts], [a['ci_high'] for _, a in pts],
                        color=f'C{i}', alpha=0.08 if st == 'all' else 0.04)
    ax.set_title(sub, fontsize=9)
    ax.set_xlabel('layer (read port layers_ℓ/attn:read)')
    ax.grid(alpha=0.3)
  flat = [r for r, p in probes.items() if p.get('n') and p['n_degenerate'] == p['n']]
  if flat:   # no line to draw: say so rather than leave the reader out silently
    title += ('\nno line for ' + ', '.join(flat) + ': every item degenerate (ΔL < ε, the '
              'answer does not move)')
  axes[0].set_ylabel('CEU (non-degenerate items)')
  axes[0].set_ylim(-0.05, 1.05)
  handles, labels = axes[0].get_legend_handles_labels()
  if labels:
    fig.legend(handles, labels, fontsize=7, loc='lower center', ncol=min(len(labels), 4),
               frameon=False)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout(rect=(0, 0.12, 1, 1))
  return plotting.save_figure(fig, stem)


PROBE_RULE = ("one run, two readers on the same items: supported if the 95% CI of the mean "
              "paired difference ΔL(shortcut) − ΔL(faithful / following) (items resampled) "
              "lies above 0, opposite if below, else not supported; untested when no item was "
              "probed for both readers")
AGREE_RULE = ("supported when the behavioural `separates` and the `probe separates` verdicts "
              "agree (both supported, or neither), not supported when one is supported and "
              "the other not, untested when either is untested")


def delta_l_difference(shortcut: Mapping, faithful: Mapping, *, seed: int,
                       stratum: Optional[str] = None):
  """ΔL(shortcut) − ΔL(faithful) paired by item (the items both readers' probes scored, of
  one stratum or all), an Aggregate with its 95% CI; None when there is no such item."""
  st_of = {**shortcut.get('stratum_by_item', {}), **faithful.get('stratum_by_item', {})}
  da, db = faithful['delta_L_by_item'], shortcut['delta_L_by_item']
  ids = sorted(i for i in da if i in db and (stratum is None or st_of.get(i) == stratum))
  if not ids:          # (sorted: a summary read back from JSON decides alike)
    return None
  return paired_difference_ci(np.asarray([db[i] for i in ids]),
                              np.asarray([da[i] for i in ids]), seed=seed)


def pair_claims(label: str, shortcut: Mapping, faithful: Mapping, behavioural, *, seed: int,
                statement: str, stratum: Optional[str] = None,
                names: tuple[str, str] = ('shortcut', 'faithful')) -> list[claims.Claim]:
  """[`<label>: probe separates`, `<label>: probe agrees`] from two readers' probe summaries
  (their per-item ΔL, one stratum's items or all) and the behavioural `separates` claim
  (None: not run)."""
  name = f'{label}: probe separates'
  agg = delta_l_difference(shortcut, faithful, seed=seed, stratum=stratum)
  if agg is None:
    probe = claims.Claim(name, statement, claims.UNTESTED, 'no item probed for both readers',
                         PROBE_RULE)
  else:
    verdict = claims.direction(
        claims.Difference('ΔL difference', (claims.SeedDifference('run', agg),)), +1)
    probe = claims.Claim(name, statement, verdict,
                         f'ΔL({names[0]}) − ΔL({names[1]}) {fmt_ci(agg, 3, signed=True)} nats '
                         f'({agg.n} items) → {verdict}', PROBE_RULE)
  return [probe, agreement(label, probe, behavioural)]


def agreement(label: str, probe: claims.Claim, behavioural: Optional[claims.Claim],
              statement: str = 'the mechanistic probe and the behavioural audit reach the '
              'same separation verdict') -> claims.Claim:
  """`<label>: probe agrees` from the `probe separates` and `separates` claims (AGREE_RULE;
  behavioural None: not run)."""
  v = (probe.verdict, None if behavioural is None else behavioural.verdict)
  if None in v or claims.UNTESTED in v:
    agree = claims.UNTESTED
  else:
    agree = (claims.SUPPORTED if (v[0] == claims.SUPPORTED) == (v[1] == claims.SUPPORTED)
             else claims.NOT_SUPPORTED)
  return claims.Claim(f'{label}: probe agrees', statement, agree,
                      f'probe: {v[0]}; behavioural: {v[1] or "not run"} → {agree}', AGREE_RULE)
