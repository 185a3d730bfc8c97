"""SPEC §8.4 companion of the trace audit on SmolLM2 (World B, issue #35 item 3): the
answer-position probe with the trace held fixed, as a layer profile at the read ports.

For an arithmetic item X (start quantity s, operations o_1..o_h, gold answer y) and a reader
(the instruction-tuned model, or a fine-tune with its adapters merged):
  D+  = the reader's prompt for X, then X's gold trace and 'Answer:' teacher-forced, then y
        (tokenised as the fine-tunes' training rows: `finetune.make_row`, `batch_arrays`);
  D−  = the same with the question's start quantity moved, X' (`moved_start`: s + δ, or
        s − δ where s + δ has another digit count; δ = the item's FactReversal offset 1..3):
        X' leads to y' ≠ y (every operation is increasing in its input), while the forced
        trace still states y's computation. D+ and D− differ in the start's digits only
        (token-aligned; checked, an item that is not is skipped and counted);
  L±  = log p(y | D±), summed over y's tokens;
  ΔL  = L+ − L−: the effect of the problem on the answer that bypasses the stated trace —
        the direct X → Y path (≈ 0 for a reader that reads its answer off the trace; large
        for one that computes or recalls it from the question);
  CEU_answer(ℓ)   = restoration of L by patching layer ℓ's read port (`layers_ℓ/attn:read`,
        the attention read) at the answer positions only (the positions that predict y's
        tokens), from D+ into D−;
  CEU_question(ℓ) = the same, patching only the part of that read that comes from the
        question's tokens (Π_S h, S = the question): the direct read of X at the answer.
Every layer in one compiled call per batch (`patching.fast_patch_audit`, tested against the
engine's record / patch). CEU is the engine's stabilised score over non-degenerate items
(ΔL ≥ ε, SPEC §1); means with 95% percentile-bootstrap CIs resampling items, overall and
per stratum (memorised: the audit items the fine-tunes were trained on; fresh).

  res = answer_probe(params, model_config, tokenizer, domain, items, strata=…)

Shape legend: B items per batch, T tokens (left-padded), T_in = T − 1 reader positions,
Q = 2 probes (PROBES), L layers, n = n_tail (the answer's tokens, the last ones).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ceu_jax import engine
from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces import finetune
from ceu_jax.metrics.resampling import mean_ci

DESCRIPTION = (
    'Arithmetic items, each reader: D+ = the prompt, the gold trace and "Answer:" teacher-'
    'forced, the gold answer y scored; D− = the same with the question\'s start quantity moved '
    '(±δ, same digits: the problem now leads elsewhere, the forced trace still to y). ΔL = '
    'log p(y | D+) − log p(y | D−): the direct X → Y path that bypasses the trace (≈ 0 for a '
    'reader that answers from its trace). CEU_answer(ℓ) = restoration by patching layer ℓ\'s '
    'read port (attention read) at the answer positions only, D+ → D−; CEU_question(ℓ) = the '
    'same for the part of that read that comes from the question\'s tokens (Π_S). CEU over '
    'non-degenerate items (ΔL ≥ ε); 95% bootstrap CIs over items.')
PROBES = ('answer', 'answer_question')   # the whole read / the read from the question
START = ' has {} '                       # the start quantity's place in make_arith_item's text


def moved_start(item: ar.ArithItem) -> ar.ArithItem:
  """X' = X with the start quantity moved by δ (same digit count), the operations kept."""
  s, d = item.start, item.delta
  s2 = s + d if len(str(s + d)) == len(str(s)) else s - d
  old = START.format(s)
  if item.question.count(old) != 1 or s2 < 0:
    raise ValueError(f'item {item.id}: the start quantity {s} is not stated once as {old!r}')
  q = item.question.replace(old, START.format(s2))
  out = dataclasses.replace(item, question=q, start=s2)
  if out.answer == item.answer:
    raise AssertionError(f'item {item.id}: moving the start left the answer {item.answer}')
  return out


def probe_rows(dom: ar.ArithmeticDomain,
               item: ar.ArithItem) -> tuple[finetune.Row, finetune.Row]:
  """(D+, D−) rows: prompt, gold trace, 'Answer: y' (no end of demonstration)."""
  plus = finetune.make_row(dom, item, 'plain')
  if not plus.target.endswith(finetune.END):
    raise AssertionError(f'item {item.id}: the gold target does not end a demonstration')
  plus = dataclasses.replace(plus, target=plus.target[:-len(finetune.END)])
  return plus, dataclasses.replace(plus, prompt=dom.prompt(moved_start(item)))


def question_chars(prompt: str, primer: str) -> tuple[int, int]:
  """Character range of the last question's text in a prompt ('Question: …\\n<primer>')."""
  lo = prompt.rindex('Question: ') + len('Question: ')
  hi = len(prompt) - len(primer) - 1
  if prompt[hi:] != '\n' + primer:
    raise ValueError('the prompt does not end with the question, a newline and the primer')
  return lo, hi


def arrays(tok, dom: ar.ArithmeticDomain, pairs: Sequence[tuple[finetune.Row, finetune.Row]],
           max_len: int) -> dict:
  """{'clean', 'corrupt'} engine inputs {tokens, valid, answer_mask} [B, T] and 'question'
  [B, T_in], the question's tokens (the span of probe 'answer_question')."""
  from ceu_jax.pretrained.tokenizer import encode
  rows_p = [p for p, _ in pairs]
  bp = finetune.batch_arrays(tok, rows_p, max_len, max_len)
  bm = finetune.batch_arrays(tok, [m for _, m in pairs], max_len, max_len)
  t = bp['tokens'].shape[1]
  question = np.zeros((len(pairs), t - 1), bool)
  for i, row in enumerate(rows_p):
    lo, hi = question_chars(row.prompt, dom.primer)
    off = t - int(bp['valid'][i].sum())
    offsets = tok.encode(row.prompt, add_special_tokens=False).offsets
    if len(offsets) != len(encode(tok, row.prompt)):
      raise AssertionError('token offsets and ids disagree')
    for j, (a, b) in enumerate(offsets):
      question[i, off + j] = a < hi and b > lo
  if not (bp['valid'] == bm['valid']).all() or not (bp['answer_mask'] == bm['answer_mask']).all():
    raise AssertionError('D+ and D− are not token-aligned')
  if ((bp['tokens'] != bm['tokens'])[:, :-1] & ~question).any():
    raise AssertionError('D+ and D− differ outside the question')
  keys = ('tokens', 'valid', 'answer_mask')
  return {'clean': {k: bp[k] for k in keys}, 'corrupt': {k: bm[k] for k in keys},
          'question': question}


def aligned(tok, pair: tuple[finetune.Row, finetune.Row]) -> bool:
  """Whether D+ and D− have the same number of tokens (moved digits of one length)."""
  return len(finetune.row_tokens(tok, pair[0])[0]) == len(finetune.row_tokens(tok, pair[1])[0])


def per_item(params: dict, model_config, tok, dom: ar.ArithmeticDomain,
             items: Sequence[ar.ArithItem], *, eps: float = 1e-3, batch_size: int = 8,
             progress: Optional[Callable[[int, int], None]] = None) -> dict:
  """The probe's per-item numbers: {ids, skipped (not token-aligned), L_plus, L_minus,
  delta_L, degenerate [n], ceu {probe: [L, n]}, L_int {probe: [L, n]}, layers}."""
  from ceu_jax.pretrained.patching import answer_positions, fast_patch_audit
  pairs = [(x, probe_rows(dom, x)) for x in items]
  skipped = [x.id for x, p in pairs if not aligned(tok, p)]
  pairs = [(x, p) for x, p in pairs if x.id not in skipped]
  out = dict(ids=[x.id for x, _ in pairs], skipped=skipped, layers=model_config.n_layers)
  if not pairs:
    return out
  max_len = max(len(finetune.row_tokens(tok, p[0])[0]) for _, p in pairs)
  cols: dict = {k: [] for k in ('L_plus', 'L_minus', 'delta_L', 'degenerate')}
  ceu = {q: [] for q in PROBES}
  lint = {q: [] for q in PROBES}
  for lo in range(0, len(pairs), batch_size):
    chunk = [p for _, p in pairs[lo:lo + batch_size]]
    real = len(chunk)
    chunk += [chunk[-1]] * (batch_size - real)        # one compiled shape for every batch
    a = arrays(tok, dom, chunk, max_len)
    pos = answer_positions(a['clean']['answer_mask'])                  # [B, T_in]
    n_tail = int(max(a['clean']['answer_mask'].sum(1)))
    span = np.stack([np.ones_like(a['question']), a['question']])     # [Q, B, T_in]
    probes = engine.Probes(span=span, positions=np.broadcast_to(pos, span.shape).copy(),
                           names=PROBES)
    prof = fast_patch_audit({'params': params}, model_config, clean=a['clean'],
                            corrupt=a['corrupt'], probes=probes, n_tail=n_tail, eps=eps)
    r0 = prof.results[0]
    for k, v in (('L_plus', r0.L_plus), ('L_minus', r0.L_minus), ('delta_L', r0.delta_L),
                 ('degenerate', r0.degenerate)):
      cols[k].append(np.asarray(v)[:real])
    for q in PROBES:
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
  """ΔL and the per-layer CEU of both probes (non-degenerate items), overall and per stratum:
  {n, n_degenerate, delta_L, layers: [{layer, ceu_answer, ceu_question}], by_stratum}."""
  ids = list(items['ids'])

  def part(keep: np.ndarray) -> dict:
    dl = np.asarray(items['delta_L'], np.float64)[keep]
    deg = np.asarray(items['degenerate'], bool)[keep]
    layers = []
    for layer in range(int(items['layers'])):
      row = {'layer': layer}
      for q, key in zip(PROBES, ('ceu_answer', 'ceu_question')):
        v = np.asarray(items['ceu'][q][layer], np.float64)[keep][~deg]
        row[key] = mean_ci(v, seed=seed).to_dict()
      layers.append(row)
    return dict(n=int(dl.size), n_degenerate=int(deg.sum()),
                delta_L=mean_ci(dl, seed=seed).to_dict(), layers=layers)

  if not ids:
    return dict(n=0, n_degenerate=0, delta_L=mean_ci(np.zeros(0)).to_dict(), layers=[],
                by_stratum={}, skipped=list(items.get('skipped', [])), delta_L_by_item={},
                stratum_by_item={})
  out = part(np.ones(len(ids), bool))
  out['skipped'] = list(items.get('skipped', []))
  out['delta_L_by_item'] = {i: float(v) for i, v in zip(ids, items['delta_L'])}
  out['stratum_by_item'] = {i: strata.get(i) for i in ids} if strata else {}
  out['by_stratum'] = {}
  if strata:
    for st in sorted({strata[i] for i in ids if strata.get(i)}):
      keep = np.asarray([strata.get(i) == st for i in ids])
      out['by_stratum'][st] = part(keep)
  return out


def peak(summary: dict, key: str = 'ceu_answer') -> Optional[dict]:
  """The layer row whose `key` mean is largest (None without non-degenerate items)."""
  rows = [x for x in summary.get('layers', []) if x[key]['value'] is not None]
  return max(rows, key=lambda x: x[key]['value']) if rows else None


# ---------------------------------------------------------------- report


def table(probes: Mapping[str, dict]) -> str:
  """Markdown: per reader and stratum, ΔL, the layer where CEU_answer peaks and both CEUs
  there, and CEU_question's own peak."""
  from ceu_jax.audits.traces.summary import fmt
  lines = ['| reader | items | n | degenerate | ΔL (nats) [95% CI] | CEU_answer peak: layer, '
           'value [95% CI] (n) | CEU_question there | CEU_question peak: layer, value |',
           '|---|---|---:|---:|---|---|---|---|']
  for r, p in probes.items():
    for st, c in [('all', p)] + sorted(p.get('by_stratum', {}).items()):
      a, q = peak(c, 'ceu_answer'), peak(c, 'ceu_question')
      ca = '—' if a is None else f"{a['layer']}: {fmt(a['ceu_answer'])} ({a['ceu_answer']['n']})"
      cq = '—' if a is None else fmt(a['ceu_question'])
      pq = '—' if q is None else f"{q['layer']}: {fmt(q['ceu_question'])}"
      lines.append(f"| {r} | {st} | {c['n']} | {c['n_degenerate']} | {fmt(c['delta_L'])} | "
                   f"{ca} | {cq} | {pq} |")
  return '\n'.join(lines)


def layer_figure(probes: Mapping[str, dict], stem: str) -> list[str]:
  """CEU_answer and CEU_question (95% CI bands) against layer: colour = reader, line style =
  stratum (solid: all items)."""
  from matplotlib.figure import Figure
  from ceu_jax import plotting
  fig = Figure(figsize=(10.0, 3.8))
  axes = fig.subplots(1, 2, sharey=True)
  styles = {'all': '-', 'memorised': '--', 'fresh': ':'}
  for ax, key, title in zip(axes, ('ceu_answer', 'ceu_question'),
                            ('CEU_answer: the read at the answer', 'CEU_question: its part '
                             'read from the question')):
    for i, (r, p) in enumerate(probes.items()):
      for st, c in [('all', p)] + sorted(p.get('by_stratum', {}).items()):
        pts = [(x['layer'], x[key]) for x in c.get('layers', []) if x[key]['value'] is not None]
        if not pts:
          continue
        xs = [L for L, _ in pts]
        ax.plot(xs, [a['value'] for _, a in pts], color=f'C{i}', ls=styles.get(st, '-.'),
                lw=1.3, label=f'{r}' + ('' if st == 'all' else f' [{st}]'))
        ax.fill_between(xs, [a['ci_low'] for _, a in pts], [a['ci_high'] for _, a in pts],
                        color=f'C{i}', alpha=0.08 if st == 'all' else 0.04)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel('layer (read port layers_ℓ/attn:read)')
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('CEU (non-degenerate items)')
  axes[0].set_ylim(-0.05, 1.05)
  handles, labels = axes[0].get_legend_handles_labels()
  if labels:
    fig.legend(handles, labels, fontsize=7, loc='lower center', ncol=min(len(labels), 4),
               frameon=False)
  fig.suptitle('§8.4 answer-position probe, trace held fixed, start quantity moved (95% CI)',
               fontsize=9)
  fig.tight_layout(rect=(0, 0.12, 1, 1))
  return plotting.save_figure(fig, stem)
