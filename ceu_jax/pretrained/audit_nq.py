"""Layer profile of causal evidence usage in SmolLM2-135M on NQ knowledge conflicts (issue #9).

  python -m experiments.audit_pretrained --config configs/smollm2_nq.py --workdir W

Pairs (SPEC §1): D+ = the original Natural Questions passage, D− = the same
passage with every mention of the gold answer replaced by a substitute entity,
gold y* = the original answer, evidence span E = the answer mention(s). Span
patching needs D+ and D− aligned token by token, so a substitute is kept only
when the two prompts have the same token count and differ only inside the
mention tokens. Substitutes are tried in order (`config.substitutes`): the
dataset's own swap entity, the prepared same-type equal-length swap
(`swap_equal`), then a same-type NQ answer drawn (seeded) among those with the
answer's token count. Rows longer than `config.max_len` tokens are reported
(count and ids), never truncated.

Probes (an `engine.Probes` set, names `EV`, `DIS`, `CONTROL`, `SITE`) at every
read port `layers_{ℓ}/attn:read` (ℓ = 0..29), patched at the answer positions
only (the input positions whose logits score the gold answer), all through
`patching.fast_patch_audit`, whose `engine.Profile` carries the engine's scores
(`engine.from_logliks`: the project's one CEU formula):
  ev      — the evidence span E;
  dis     — a distractor mention: another capitalised entity mention in the
            passage with E's token count (falls back to another context span
            of that length when the passage has none; `dis_kind` says which);
  control — a random context span of that length, disjoint from E (and from
            the distractor when there is room); expected ≈ 0;
  site    — (optional) the whole read port: the layer's total share.
Distractor and control spans never touch a word that spells the answer or the
substitute another way (`probe_spans`, issue #22); an item without such a span
has no `dis` / `control` score (counted in the summary, never filled).

The job runs on the one job contract (`ceu_jax.jobs.run_job`: the workdir lock,
the config check against W/job.json — every field, eps, n_layers, gguf_path and
site_probe included — W/units/ resumed, atomic outputs, progress); a unit is one
planned batch. Outputs in the workdir: plan.json (the batches), examples.csv (one row per example × layer), summary.json (per layer and probe:
mean CEU with a bootstrap 95% CI and n; degenerate gaps flagged and counted;
items without a valid distractor / control span counted)
and plots/layer_profile.{png,pdf}.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import io as _io
import json
import re
import zlib
from typing import Any, Optional, Sequence

import numpy as np

from ceu_jax import engine, jobs
from ceu_jax.engine.probes import CONTROL, DIS, EV, SPAN_PROBES
from ceu_jax.metrics import mean_ci
from ceu_jax.pretrained import probe_spans

# Probe names: the engine's (results are read by these, never by position). EV is the
# evidence span E (the answer mentions), DIS a distractor mention of E's token count,
# CONTROL a random context span of E's token count; SITE the whole read port.
SITE = 'site'
OPTIONAL_PROBES = (DIS, CONTROL)  # may be absent for an item (no valid span)
SUBSTITUTE_SOURCES = ('dataset', 'swap_equal', 'drawn')  # where a substitute entity comes from
CONTEXT_PREFIX = 'Context: '  # ceu_jax.pretrained.format_prompt starts with this


@dataclasses.dataclass(frozen=True)
class Pair:
  """One token-aligned knowledge-conflict pair (positions index the unpadded prompt)."""
  id: str
  question: str
  answer: str
  substitute: str
  swap_source: str  # dataset | swap_equal | drawn
  clean_prompt: str
  corrupt_prompt: str
  prompt_tokens: int
  answer_tokens: int
  ev: tuple[int, ...]  # evidence token positions
  dis: tuple[int, ...]  # distractor token positions (() when no valid span)
  dis_kind: str  # entity | context | none
  control: tuple[int, ...]  # control token positions (() when no valid span)

  @property
  def length(self) -> int:
    """Tokens of prompt + answer (the encoded row)."""
    return self.prompt_tokens + self.answer_tokens


# ----------------------------------------------------------------------------
# Pairs.
# ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def nq_records(split: str) -> tuple[tuple[dict, str], ...]:
  """(example record, passage text) of the shipped NQ items of `split`, by id (cached)."""
  from ceu_jax.data.factqa import storage
  passages = storage.read_passages()
  recs = [e for e in storage.read_examples() if e['source'] == 'nq' and e['split'] == split]
  if not recs:
    raise ValueError(f'no NQ items in split {split!r} (train | validation | test)')
  return tuple((e, ' '.join(passages[e['passage_id']]['sentences']))
               for e in sorted(recs, key=lambda e: e['id']))


def _mentions(text: str, needle: str, lo: int, hi: int) -> list[tuple[int, int]]:
  """Whole-word occurrences (start, end) of `needle` in text[lo:hi]."""
  pat = re.compile(r'(?<!\w)' + re.escape(needle) + r'(?!\w)')
  return [(m.start(), m.end()) for m in pat.finditer(text, lo, hi)]


def _swap(context: str, mentions: list[tuple[int, int]], sub: str) -> tuple[str, list]:
  """context with each mention replaced by sub, and the new mention ranges."""
  out, ranges, last, shift = [], [], 0, 0
  for s, e in mentions:
    out.append(context[last:s] + sub)
    ranges.append((s + shift, s + shift + len(sub)))
    shift += len(sub) - (e - s)
    last = e
  return ''.join(out) + context[last:], ranges


def _aligned(tok, clean: str, corrupt: str, ranges_p: list, ranges_m: list
             ) -> Optional[tuple[Any, tuple[int, ...]]]:
  """(clean encoding, evidence positions) when D+ and D− align token by token."""
  ep = tok.encode(clean, add_special_tokens=False)
  em = tok.encode(corrupt, add_special_tokens=False)
  if len(ep.ids) != len(em.ids):
    return None
  ev = probe_spans.positions(ep.offsets, ranges_p)
  if not ev or ev != probe_spans.positions(em.offsets, ranges_m):
    return None
  diff = {j for j, (a, b) in enumerate(zip(ep.ids, em.ids)) if a != b}
  return (ep, ev) if diff and diff <= set(ev) else None


def _rng(key: str, seed: int) -> np.random.Generator:
  return np.random.default_rng([seed, zlib.crc32(key.encode())])


def drawn_pool(tok, records: Sequence[tuple[dict, str]]) -> dict[tuple[str, int], list[str]]:
  """Other NQ answers by (answer type, token count of ' ' + answer)."""
  from ceu_jax.pretrained.tokenizer import encode
  pool: dict[tuple[str, int], list[str]] = {}
  for e, _ in records:
    key = (e['answer_type'], len(encode(tok, ' ' + e['answer'])))
    pool.setdefault(key, []).append(e['answer'])
  return {k: sorted(set(v)) for k, v in pool.items()}


def _candidates(rec: dict, pool: dict, n_ans: int, sources: Sequence[str],
                rng: np.random.Generator, n_draws: int) -> list[tuple[str, str]]:
  """(substitute, source) in the order to try them."""
  out = [(rec.get('swap'), 'dataset'), (rec.get('swap_equal'), 'swap_equal')]
  drawn = pool.get((rec['answer_type'], n_ans), [])
  if drawn:
    out += [(drawn[i], 'drawn') for i in rng.permutation(len(drawn))[:n_draws]]
  return [(s, src) for s, src in out if s and src in sources and s != rec['answer']]


def make_pair(tok, rec: dict, context: str, pool: dict, config) -> tuple[Optional[Pair], str]:
  """(Pair, 'kept') or (None, reason) for one NQ item."""
  from ceu_jax.pretrained.tokenizer import encode, format_prompt
  prompt = format_prompt(context, rec['question'])
  lo = len(CONTEXT_PREFIX)
  hi = lo + len(context.strip())
  mentions = _mentions(prompt, rec['answer'], lo, hi)
  if not mentions:
    return None, 'answer_not_in_context'
  n_ans = len(encode(tok, ' ' + rec['answer']))
  n_prompt = len(encode(tok, prompt))
  if n_ans > config.max_answer_tokens:
    return None, 'answer_too_long'
  if n_prompt + n_ans > config.max_len:
    return None, 'too_long'
  rng = _rng(rec['id'], config.seed)
  for sub, src in _candidates(rec, pool, n_ans, config.substitutes, rng, config.n_draws):
    if _mentions(prompt, sub, lo, hi):
      continue
    corrupt, ranges_m = _swap(prompt, mentions, sub)
    got = _aligned(tok, prompt, corrupt, mentions, ranges_m)
    if got is None:
      continue
    enc, ev = got
    dis, kind, ctl = probe_spans.choose_spans(prompt, enc.offsets, lo, hi, ev,
                                              (rec['answer'], sub), rng)
    return Pair(rec['id'], rec['question'], rec['answer'], sub, src, prompt, corrupt,
                len(enc.ids), n_ans, ev, dis, kind, ctl), 'kept'
  return None, 'no_aligned_substitute'


def _missing(kept: Sequence[Pair], chosen: Sequence[Pair], name: str) -> dict:
  """Items without a valid `name` span (issue #22): counts among kept and audited, ids."""
  ids = [p.id for p in chosen if not getattr(p, name)]
  return {'kept': sum(not getattr(p, name) for p in kept), 'audited': len(ids),
          'audited_ids': ids}


def build_pairs(tok, config) -> tuple[list[Pair], dict]:
  """The audited pairs (≤ config.num_pairs, seeded order) and the selection report."""
  records = nq_records(config.split)
  pool = drawn_pool(tok, records)
  if config.max_items:
    records = records[:config.max_items]
  kept, reasons = [], {}
  for rec, context in records:
    pair, why = make_pair(tok, rec, context, pool, config)
    if pair is None:
      reasons.setdefault(why, []).append(rec['id'])
    else:
      kept.append(pair)
  order = np.random.default_rng(config.seed).permutation(len(kept))
  chosen = sorted((kept[i] for i in order[:config.num_pairs]), key=lambda p: p.id)
  n = len(records)
  by_src = {s: sum(p.swap_source == s for p in kept) for s in ('dataset', 'swap_equal', 'drawn')}
  report = {
      'split': config.split, 'items': n, 'kept': len(kept), 'share_kept': len(kept) / n,
      'kept_by_substitute': by_src,
      'share_kept_dataset_swap_only': by_src['dataset'] / n,
      'dropped': {k: len(v) for k, v in sorted(reasons.items())},
      'too_long': {'max_len': config.max_len, 'count': len(reasons.get('too_long', [])),
                   'ids': reasons.get('too_long', [])},
      'dropped_ids': {k: v for k, v in sorted(reasons.items()) if k != 'too_long'},
      'audited': len(chosen),
      'audited_dis_kind': {k: sum(p.dis_kind == k for p in chosen)
                           for k in ('entity', 'context', 'none')},
      'no_valid_span': {name: _missing(kept, chosen, name) for name in OPTIONAL_PROBES},
  }
  return chosen, report


# ----------------------------------------------------------------------------
# Batches.
# ----------------------------------------------------------------------------


def _bucket(x: int, buckets: Sequence[int]) -> int:
  return next(b for b in sorted(buckets) if b >= x)


def _spans_digest(pairs: Sequence[Pair]) -> int:
  """Checksum of the batch's probe spans (a rerun with other spans needs a fresh workdir)."""
  return zlib.crc32(repr([(p.id, p.ev, p.dis, p.control) for p in pairs]).encode())


def plan_batches(pairs: Sequence[Pair], config) -> list[dict]:
  """Fixed-shape batches [{'ids', 'pad_to', 'n_tail', 'spans'}], grouped by length buckets."""
  groups: dict[tuple[int, int], list[Pair]] = {}
  for p in pairs:
    key = (_bucket(p.length, config.length_buckets), _bucket(p.answer_tokens, config.tail_buckets))
    groups.setdefault(key, []).append(p)
  plan = []
  for (pad_to, n_tail), ps in sorted(groups.items()):
    for i in range(0, len(ps), config.batch_size):
      chunk = ps[i:i + config.batch_size]
      plan.append({'ids': [p.id for p in chunk], 'pad_to': pad_to, 'n_tail': n_tail,
                   'spans': _spans_digest(chunk)})
  return plan


def batch_arrays(tok, pairs: Sequence[Pair], batch_size: int, pad_to: int) -> dict:
  """Engine inputs of D+ / D− and [B, T_in] span masks by probe name.

  {'clean', 'corrupt': {'tokens', 'valid', 'answer_mask'} [B, T = pad_to],
  'spans': {name: [B, T_in = T − 1] bool} over the model's input positions}.
  Short batches repeat their last row; an absent span is all False.
  """
  from ceu_jax.pretrained.patching import engine_inputs
  from ceu_jax.pretrained.tokenizer import encode_batch
  rows = list(pairs) + [pairs[-1]] * (batch_size - len(pairs))
  answers = [p.answer for p in rows]
  bp = encode_batch(tok, [p.clean_prompt for p in rows], answers, pad_to=pad_to)
  bm = encode_batch(tok, [p.corrupt_prompt for p in rows], answers, pad_to=pad_to)
  if not ((bp.valid == bm.valid).all() and (bp.answer_mask == bm.answer_mask).all()):
    raise AssertionError('clean and corrupted rows are not token-aligned')
  spans = {name: np.zeros((len(rows), pad_to - 1), bool) for name in SPAN_PROBES}
  for i, p in enumerate(rows):
    off = pad_to - p.length
    for name in SPAN_PROBES:
      spans[name][i, off + np.asarray(getattr(p, name), int)] = True
  if ((bp.tokens != bm.tokens)[:, :-1] & ~spans[EV]).any():
    raise AssertionError('D+ and D− differ outside the evidence span')
  return {'clean': engine_inputs(bp), 'corrupt': engine_inputs(bm), 'spans': spans}


def batch_probes(arrays: dict, probes: Sequence[str]) -> engine.Probes:
  """The `engine.Probes` of a batch: one span per name (SITE: every position),
  each at the answer positions only (`patching.answer_positions`)."""
  from ceu_jax.pretrained.patching import answer_positions
  ev = arrays['spans'][EV]
  span = np.stack([np.ones_like(ev) if name == SITE else arrays['spans'][name]
                   for name in probes])  # [Q, B, T_in]
  pos = answer_positions(arrays['clean']['answer_mask'])
  return engine.Probes(span=span, positions=np.broadcast_to(pos, span.shape).copy(),
                       names=tuple(probes))


def audit_batch(variables: dict, model_config, arrays: dict, n_tail: int,
                probes: Sequence[str], eps: float) -> engine.Profile:
  """The engine profile (one `AuditResult` per layer) of one batch."""
  from ceu_jax.pretrained.patching import fast_patch_audit
  return fast_patch_audit(variables, model_config, clean=arrays['clean'],
                          corrupt=arrays['corrupt'], probes=batch_probes(arrays, probes),
                          n_tail=n_tail, eps=eps)


def batch_rows(pairs: Sequence[Pair], profile: engine.Profile,
               probes: Sequence[str]) -> list[dict]:
  """One row per (example, layer): gold log-likelihoods and the engine's scores.

  ceu_{probe} is None where the gap is degenerate (ΔL < ε) or the item has no
  valid span for that probe (`has_{probe}` False).
  """
  from ceu_jax.pretrained.model import layer_index
  rows = []
  for site, res in zip(profile.sites, profile.results):
    layer = layer_index(site.split(':')[0])
    lp, lm, gap, deg = (np.asarray(x, np.float64) for x in
                        (res.L_plus, res.L_minus, res.delta_L, res.degenerate))
    l_int = {name: np.asarray(res.row('L_int', name), np.float64) for name in probes}
    ceu = {name: np.asarray(res.ceu_of(name), np.float64) for name in probes}
    for i, p in enumerate(pairs):
      row = {'id': p.id, 'layer': layer, 'swap_source': p.swap_source,
             'substitute': p.substitute, 'answer': p.answer, 'dis_kind': p.dis_kind,
             'tokens': p.length, 'answer_tokens': p.answer_tokens, 'span_tokens': len(p.ev),
             'L_plus': float(lp[i]), 'L_minus': float(lm[i]), 'gap': float(gap[i]),
             'degenerate': bool(deg[i])}
      for name in probes:
        has = bool(getattr(p, name)) if name in OPTIONAL_PROBES else True
        row[f'has_{name}'] = has
        row[f'L_int_{name}'] = float(l_int[name][i]) if has else None
        row[f'ceu_{name}'] = float(ceu[name][i]) if has and not deg[i] else None
      rows.append(row)
  return sorted(rows, key=lambda r: (r['id'], r['layer']))


# ----------------------------------------------------------------------------
# Summary and plot.
# ----------------------------------------------------------------------------


def _agg(x: np.ndarray, config) -> dict:
  return mean_ci(x, num_resamples=config.num_resamples, seed=config.seed).to_dict()


def _peak(per_layer: list[dict], name: str) -> Optional[int]:
  """Layer with the largest mean CEU of a probe (None when no layer has one)."""
  vals = [(e[name]['ceu']['value'], e['layer']) for e in per_layer
          if e[name]['ceu']['value'] is not None]
  return max(vals)[1] if vals else None


def summarize(rows: list[dict], probes: Sequence[str], n_layers: int, config) -> dict:
  """Per layer and probe: mean CEU and mean Δ = L_int − L− with bootstrap CIs.

  A probe's means are over the items with a non-degenerate gap and a valid
  span for that probe (`n` in each aggregate); items without a valid
  distractor / control span are counted under 'no_valid_span'.
  """
  first = [r for r in rows if r['layer'] == 0]
  degenerate = sorted(r['id'] for r in first if r['degenerate'])
  per_layer = []
  for layer in range(n_layers):
    entry = {'layer': layer}
    for name in probes:
      rs = [r for r in rows if r['layer'] == layer and r[f'ceu_{name}'] is not None]
      entry[name] = {'ceu': _agg(np.array([r[f'ceu_{name}'] for r in rs]), config),
                     'delta': _agg(np.array([r[f'L_int_{name}'] - r['L_minus'] for r in rs]),
                                   config)}
    per_layer.append(entry)
  peak = {name: _peak(per_layer, name) for name in probes}
  missing = {name: sorted(r['id'] for r in first if not r[f'has_{name}'])
             for name in probes if name in OPTIONAL_PROBES}
  return {
      'n_examples': len(first), 'n_degenerate': len(degenerate), 'degenerate_ids': degenerate,
      'no_valid_span': {name: {'count': len(ids), 'ids': ids} for name, ids in missing.items()},
      'eps': config.eps,
      'L_plus': _agg(np.array([r['L_plus'] for r in first]), config),
      'L_minus': _agg(np.array([r['L_minus'] for r in first]), config),
      'gap': _agg(np.array([r['gap'] for r in first]), config),
      'per_layer': per_layer, 'peak_layer': peak,
  }


LABELS = {EV: 'CEU_ev (evidence span)', DIS: 'CEU_dis (distractor mention)',
          CONTROL: 'control (random span)', SITE: 'whole read port'}


def plot_profile(summary: dict, probes: Sequence[str], stem: str) -> list[str]:
  """CEU by layer per probe with 95% CI bands -> stem.{png,pdf}."""
  from matplotlib.figure import Figure

  from ceu_jax.plotting import save_figure
  fig = Figure(figsize=(7, 4))
  ax = fig.add_subplot()
  layers = [e['layer'] for e in summary['per_layer']]
  for name in probes:
    agg = [e[name]['ceu'] for e in summary['per_layer']]
    val = np.array([a['value'] if a['value'] is not None else np.nan for a in agg])
    lo = np.array([a['ci_low'] if a['ci_low'] is not None else np.nan for a in agg])
    hi = np.array([a['ci_high'] if a['ci_high'] is not None else np.nan for a in agg])
    line, = ax.plot(layers, val, marker='o', ms=3, label=f'{LABELS[name]}, n={agg[0]["n"]}',
                    ls='--' if name == SITE else '-')
    ax.fill_between(layers, lo, hi, color=line.get_color(), alpha=0.2)
  ax.set(xlabel='layer ℓ (read port layers_ℓ/attn, answer positions)', ylabel='mean CEU',
         title='SmolLM2-135M, NQ knowledge conflicts (95% bootstrap CI)')
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  return save_figure(fig, stem)


# ----------------------------------------------------------------------------
# Driver.
# ----------------------------------------------------------------------------


COLUMNS = ('id', 'layer', 'answer', 'substitute', 'swap_source', 'dis_kind', 'tokens',
           'answer_tokens', 'span_tokens', 'L_plus', 'L_minus', 'gap', 'degenerate')
# then has_{probe}, L_int_{probe}, ceu_{probe} for every probe


def _csv(rows: list[dict], probes: Sequence[str]) -> str:
  cols = (list(COLUMNS) + [f'has_{p}' for p in probes] + [f'L_int_{p}' for p in probes]
          + [f'ceu_{p}' for p in probes])
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=cols, lineterminator='\n')
  w.writeheader()
  w.writerows({k: ('' if v is None else v) for k, v in r.items()} for r in rows)
  return buf.getvalue()


def validate(config) -> None:
  """Every count the job reads, checked before anything is built or written."""
  for name, lo in (('num_pairs', 1), ('batch_size', 1), ('max_len', 2), ('max_answer_tokens', 1),
                   ('n_layers', 0), ('n_draws', 0), ('max_items', 0), ('num_resamples', 1)):
    v = config[name]
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
      raise ValueError(f'{name} must be an integer >= {lo}, got {v!r}')
  if not float(config.eps) >= 0:
    raise ValueError(f'eps must be >= 0, got {config.eps!r}')
  for name in ('length_buckets', 'tail_buckets'):
    b = tuple(config[name])
    if not b or any(int(x) < 1 for x in b) or list(b) != sorted(set(b)):
      raise ValueError(f'{name} must be increasing positive lengths, got {b}')
  if max(config.length_buckets) < config.max_len:
    raise ValueError(f'length_buckets must reach max_len ({config.max_len}), got '
                     f'{tuple(config.length_buckets)}')
  bad = [s for s in config.substitutes if s not in SUBSTITUTE_SOURCES]
  if bad or not config.substitutes:
    raise ValueError(f'substitutes must be a non-empty subset of {SUBSTITUTE_SOURCES}, got '
                     f'{tuple(config.substitutes)}')


class PretrainedAuditJob(jobs.Job):
  """The SmolLM2 layer-profile audit on the one job contract: a unit is one planned
  batch of pairs (W/units/batch_<b>.json), every layer and probe."""
  name = 'pretrained_audit'

  def __init__(self, config):
    validate(config)
    super().__init__(config)
    self.probes = SPAN_PROBES + ((SITE,) if config.site_probe else ())
    self._model = None

  def prepare(self, ctx):
    from ceu_jax.pretrained import load_tokenizer
    config = self.config
    self.tok = load_tokenizer(config.gguf_path or None)
    self.pairs, self.report = build_pairs(self.tok, config)
    if not self.pairs:
      raise ValueError(f'no aligned pairs: {json.dumps(self.report["dropped"])}')
    r = self.report
    ctx.log(f'[{self.name}] {r["kept"]}/{r["items"]} pairs aligned ({r["share_kept"]:.1%}); '
            f'auditing {len(self.pairs)}; {r["too_long"]["count"]} longer than '
            f'{config.max_len} tokens reported, not truncated')
    self.batches = plan_batches(self.pairs, config)
    if ctx.exists('plan.json') and ctx.read_json('plan.json') != self.batches:
      raise jobs.JobError(f'{ctx.path("plan.json")} was planned with other probe spans under '
                          'the same config (another ceu-jax version?); use a fresh workdir')
    ctx.write_json('plan.json', self.batches)

  def plan(self, ctx):
    return [jobs.Unit(f'batch_{b:05d}', b) for b in range(len(self.batches))]

  def run_unit(self, ctx, b):
    from ceu_jax.pretrained import load_smollm2
    config, spec = self.config, self.batches[b]
    if self._model is None:
      self._model = load_smollm2(config.gguf_path or None, n_layers=config.n_layers or None)
    by_id = {p.id: p for p in self.pairs}
    ps = [by_id[i] for i in spec['ids']]
    arrays = batch_arrays(self.tok, ps, config.batch_size, spec['pad_to'])
    out = audit_batch(self._model[1], self._model[0], arrays, spec['n_tail'], self.probes,
                      config.eps)
    return batch_rows(ps, out, self.probes)

  def describe_unit(self, b, result):
    spec = self.batches[b]
    return f'T={spec["pad_to"]}, n_tail={spec["n_tail"]}'

  def _rows(self, results) -> list[dict]:
    return [r for b in range(len(self.batches)) for r in results[f'batch_{b:05d}']]

  def summarize(self, ctx, results):
    rows = self._rows(results)
    n_layers = max(r['layer'] for r in rows) + 1
    summary = summarize(rows, self.probes, n_layers, self.config)
    summary.update(pairs=self.report, probes=list(self.probes),
                   model='SmolLM2-135M-Instruct (Q4_1 GGUF, float32)',
                   ports='layers_{l}/attn:read at the answer positions')
    return summary

  def write(self, ctx, results, summary):
    ctx.write_text('examples.csv', _csv(self._rows(results), self.probes))
    if ctx.primary:
      plot_profile(summary, self.probes, ctx.path('plots', 'layer_profile'))


def run_pretrained_audit(config, workdir: str, log=print) -> dict:
  """Runs (or resumes) the audit; writes examples.csv, summary.json, plots/; returns the summary."""
  return jobs.run_job(PretrainedAuditJob(config), workdir, log=log)
