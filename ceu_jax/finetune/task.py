"""Fine-tuning SmolLM2 on factual QA with or without CER, in the project's training loop.

  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:tiny --workdir W

`SmolLM2CERTask(config)` is a `ceu_jax.train.task.CustomTask`: the loop
(`ceu_jax.train.loop.train_and_evaluate(config, workdir, custom=task)`) keeps its
checkpointing, resume, SIGTERM, NaN handling and metric files; the task gives
the parameters (LoRA adapters by default: `lora.py`; the base weights are the
loss's frozen argument, never in a checkpoint), the batches and the objective
(`cer_objective.lm_cer_loss` at `layers_{model.read_layer}/attn:read`).

Data (Natural Questions items of the shipped factual-QA set): an item's context
is its evidence sentence (the one holding the answer) plus up to
`data.n_distractor_sentences` other sentences of its passage (seeded, in passage
order), so prompts stay short for CPU. Pairs are the SmolLM2 audit's entity
swap (`audit_nq.make_pair`): D− replaces every answer mention by a substitute
entity with the same token count, D+ and D− token-aligned; dis = another
entity mention of the context (distractor), control = a random span. Items
whose pair cannot be aligned, or that are longer than data.max_len tokens, are
dropped and counted (never truncated). Training batch of step s: rows
s·B … s·B + B − 1 of an endless sequence of seeded epoch permutations, a pure
function of (seed, step).

Memorisable-prior world (issue #36): with a `data.world` section the training rows are
those of `ceu_jax.data.factqa.prior_world` (a share ρ of the items recurs `repeats`
times per epoch with a fixed answer, a share η of the contexts lacks the evidence)
instead of one row per train-split pair; a row without evidence — and a conflicting row
(knob κ: the context names another entity, the target stays the memorised answer) — has
D− = D+ and no probe span (`has_ev` False: no CER term, only −log p(y* | q, D)).
`world_pairs` builds it; the evaluation's strata are `evaluate.py`'s.

Config sections: seed, data, model, lora, train, cer, eval, sharding
(configs/smollm2_cer.py documents every field).
"""
from __future__ import annotations

import dataclasses
import functools
import types
import zlib
from typing import Any, Optional, Sequence

import jax
import numpy as np

from ceu_jax.data.factqa import prior_world
from ceu_jax.pretrained import audit_nq
from ceu_jax.finetune import objective as obj
from ceu_jax.pretrained import lora as lora_lib
from ceu_jax.pretrained.model import SmolLMConfig
from ceu_jax import audit_config, fields
from ceu_jax import sharding as sharding_lib
from ceu_jax.train import config as config_lib
from ceu_jax.train.losses import LossConfig

SECTIONS = ('seed', 'data', 'model', 'lora', 'train', 'cer', 'eval', 'sharding')
N_LAYERS = 30  # SmolLM2-135M
SPLITS = ('train', 'validation', 'test')
DATA_FIELDS = {
    'train_split': fields.one_of(*SPLITS), 'eval_split': fields.one_of(*SPLITS),
    'max_items': fields.ge(0, True), 'n_distractor_sentences': fields.one_of(0, 1, 2),
    'max_len': fields.ge(8, True), 'max_answer_tokens': fields.ge(1, True),
    'substitutes': lambda x: None if isinstance(x, (tuple, list)) and x and all(
        s in ('dataset', 'swap_equal', 'drawn') for s in x) else
    "must be a non-empty subset of ('dataset', 'swap_equal', 'drawn')",
    'n_draws': fields.ge(0, True),
    'answer_end': fields.one_of('', '\n'),
}
MODEL_FIELDS = {
    'gguf_path': lambda x: None if isinstance(x, str) else 'must be a path or ""',
    'n_layers': fields.ge(0, True), 'read_layer': lambda x: None,  # checked below
    'cer_path': fields.one_of(*obj.PATHS),
}
LORA_FIELDS = {
    'rank': fields.ge(1, True), 'alpha': fields.gt(0), 'full': fields.boolean,
    'targets': lambda x: None if isinstance(x, (tuple, list)) and x and all(
        t in lora_lib.TARGETS for t in x) else f'must be a non-empty subset of '
    f'{lora_lib.TARGETS}',
}
EVAL_FIELDS = {'num_examples': fields.ge(1, True), 'batch_size': fields.ge(1, True),
               'best_metric': fields.one_of(*config_lib.BEST_METRICS),
               'num_resamples': fields.ge(0, True), 'max_new_tokens': fields.ge(1, True),
               'eps': audit_config.EVAL_FIELDS['eps'],
               'delta_test': lambda x: None if isinstance(x, (tuple, list)) and all(
                   fields.is_num(d) and 0.0 <= float(d) <= 1.0 for d in x) else
               'must be a tuple of distractor strengths in [0, 1] (may be empty)'}


def model_layers(config: Any) -> int:
  """Layers of the configured model (model.n_layers, 0 = all 30), without loading it."""
  n = int(config.model.n_layers)
  return N_LAYERS if n == 0 else min(n, N_LAYERS)


def validate(config: Any) -> None:
  """ValueError naming the field for a bad config; nothing is loaded or compiled."""
  fields.check_top(config, SECTIONS)
  data = dict(fields.items_of(config.data))
  data.setdefault('answer_end', '')   # a config recorded before the field trained no end
  if 'world' in data:   # the memorisable-prior world (optional section)
    prior_world.WorldConfig.from_config(data.pop('world'))
  fields.check_section('data', data, DATA_FIELDS)
  fields.check_section('model', config.model, MODEL_FIELDS)
  fields.check_section('lora', config.lora, LORA_FIELDS)
  fields.check_section('train', config.train, config_lib.TRAIN_FIELDS)
  fields.check_section('cer', config.cer, config_lib.CER_FIELDS)
  fields.check_section('eval', config.eval, EVAL_FIELDS)
  lora_lib.check_layer(config.model.read_layer, SmolLMConfig(n_layers=model_layers(config)),
                       'model.read_layer')
  c, t = config.cer, config.train
  if c.corruption != 'entity_swap':
    raise ValueError(f"cer.corruption must be 'entity_swap' (the token-aligned factual-QA "
                     f"pairs), got {c.corruption!r}")
  if c.regularizer == 'evidence_distractor' and c.k < 2:
    raise ValueError(f'cer.k must be >= 2 for regularizer evidence_distractor, got {c.k}')
  if c.lambda_noret > 0:
    raise ValueError(f'cer.lambda_noret must be 0 here (no empty-context runs), got '
                     f'{c.lambda_noret}')
  if t.warmup_steps > t.num_steps:
    raise ValueError(f'train.warmup_steps ({t.warmup_steps}) must be <= train.num_steps '
                     f'({t.num_steps})')
  if int(t.eval_every):
    raise ValueError(f'train.eval_every must be 0 (held-out evaluation runs after training: '
                     f'`evaluate`), got {t.eval_every}')
  if config.data.max_answer_tokens >= config.data.max_len:
    raise ValueError('data.max_answer_tokens must be < data.max_len')
  sharding_lib.check_section(config.sharding)


def loss_config(config: Any) -> LossConfig:
  return LossConfig.from_config(config.cer)


# ----------------------------------------------------------------------------
# Pairs.
# ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _storage() -> tuple[tuple[dict, ...], dict]:
  from ceu_jax.data.factqa import storage
  return tuple(storage.read_examples()), storage.read_passages()


def _context_indices(rec: dict, passage: dict, n_distractors: int, seed: int) -> list[int]:
  """The sentence indices of `short_context`, in passage order."""
  ev = int(rec['sentence_index'])
  others = [i for i in range(len(passage['sentences'])) if i != ev]
  rng = np.random.default_rng([seed, zlib.crc32(rec["id"].encode())])
  return sorted([ev] + [others[i] for i in rng.permutation(len(others))[:n_distractors]])


def short_context(rec: dict, passage: dict, n_distractors: int, seed: int) -> str:
  """The evidence sentence plus up to n other sentences of the passage, in order."""
  sents = passage['sentences']
  return ' '.join(sents[i] for i in _context_indices(rec, passage, n_distractors, seed))


def injected_prompts(config: Any, pairs: Sequence[audit_nq.Pair], delta: float
                     ) -> tuple[list[str], list[int]]:
  """Clean prompts of `pairs` with distractor injection at strength δ (robustness, δ_test).

  In each item's short context every sentence other than the evidence sentence is,
  with probability δ (seeded by (seed, δ, item id)), replaced by a distractor: the
  evidence sentence of another item of the split (another passage, a sentence that
  does not contain this item's answer after SQuAD normalisation), so the context
  holds more answer-shaped statements about other questions while the evidence stays.
  Returns (prompts, distractors injected per item).
  """
  from ceu_jax.metrics.text import normalize_answer
  from ceu_jax.pretrained.tokenizer import format_prompt
  if not 0.0 <= float(delta) <= 1.0:
    raise ValueError(f'eval.delta_test values must be in [0, 1], got {delta!r}')
  d, seed = config.data, int(config.seed)
  examples, passages = _storage()
  by_id = {e['id']: e for e in examples}
  split = [e for e in examples if e['source'] == 'nq' and e['split'] == d.eval_split]
  pool = sorted(((e['id'], e['passage_id'],
                  passages[e['passage_id']]['sentences'][int(e['sentence_index'])])
                 for e in split), key=lambda t: t[0])
  prompts, counts = [], []
  for pair in pairs:
    rec = by_id[pair.id]
    passage = passages[rec['passage_id']]
    sents = passage['sentences']
    ev = int(rec['sentence_index'])
    gold = normalize_answer(rec['answer'])
    rng = np.random.default_rng([seed, int(round(float(delta) * 1000)),
                                 zlib.crc32(rec['id'].encode())])
    out, n = [], 0
    for i in _context_indices(rec, passage, int(d.n_distractor_sentences), seed):
      if i == ev or rng.random() >= float(delta):
        out.append(sents[i])
        continue
      for j in rng.permutation(len(pool)):
        _, pid, text = pool[j]
        if pid != rec['passage_id'] and gold not in normalize_answer(text):
          out.append(text)
          n += 1
          break
      else:
        out.append(sents[i])
    prompts.append(format_prompt(' '.join(out), rec['question']))
    counts.append(n)
  return prompts, counts


def build_pairs(tok, config: Any, split: str, limit: Optional[int] = None,
                exclude_questions: frozenset = frozenset()
                ) -> tuple[list[audit_nq.Pair], dict]:
  """Token-aligned entity-swap pairs of `split` (NQ) with short contexts, and a report.

  limit: stop after this many pairs (items in id order); config.data.max_items
  bounds the items scanned (0: all). exclude_questions: normalised questions
  (`prior_world.question_key`) whose items are skipped (counted as 'seen_question').
  """
  d = config.data
  examples, passages = _storage()
  recs = sorted((e for e in examples if e['source'] == 'nq' and e['split'] == split),
                key=lambda e: e['id'])
  if d.max_items:
    recs = recs[:int(d.max_items)]
  pool = audit_nq.drawn_pool(tok, [(e, '') for e in recs])
  pc = _pair_config(config)
  pairs, dropped, scanned = [], {}, 0
  for e in recs:
    scanned += 1
    if exclude_questions and prior_world.question_key(e['question']) in exclude_questions:
      dropped['seen_question'] = dropped.get('seen_question', 0) + 1
      continue
    ctx = short_context(e, passages[e['passage_id']], int(d.n_distractor_sentences),
                        int(config.seed))
    pair, why = audit_nq.make_pair(tok, e, ctx, pool, pc)
    if pair is None:
      dropped[why] = dropped.get(why, 0) + 1
    else:
      pairs.append(pair)
      if limit is not None and len(pairs) >= limit:
        break
  return pairs, {'split': split, 'scanned': scanned, 'kept': len(pairs), 'dropped': dropped}


def _pair_config(config: Any) -> types.SimpleNamespace:
  d = config.data
  return types.SimpleNamespace(max_len=int(d.max_len), max_answer_tokens=int(d.max_answer_tokens),
                               seed=int(config.seed), substitutes=tuple(d.substitutes),
                               n_draws=int(d.n_draws))


def world_config(config: Any) -> Optional[prior_world.WorldConfig]:
  """The checked `data.world` section, None without one (no prior world)."""
  if 'world' not in fields.items_of(config.data):
    return None
  return prior_world.WorldConfig.from_config(config.data.world)


def fixed_pair(tok, item: prior_world.Item, context: str,
               max_len: int) -> Optional[audit_nq.Pair]:
  """A world row that holds no evidence for its answer (the no-evidence and the conflicting
  rows) as a Pair with D− = D+ and no probe span (None when prompt + answer is longer
  than max_len tokens)."""
  from ceu_jax.pretrained.tokenizer import encode, format_prompt
  prompt = format_prompt(context, item.question)
  n_p, n_a = len(encode(tok, prompt)), len(encode(tok, ' ' + item.answer))
  if n_p + n_a > max_len:
    return None
  return audit_nq.Pair(item.id, item.question, item.answer, '', 'none', prompt, prompt,
                       n_p, n_a, (), (), 'none', ())


def swapped_context(pair: audit_nq.Pair, context: str) -> str:
  """`context` as the pair's D− shows it (its answer mentions swapped for the substitute):
  the entity swap edits only the context part of the prompt."""
  from ceu_jax.pretrained.tokenizer import format_prompt
  lo = len(audit_nq.CONTEXT_PREFIX)
  tail = len(pair.clean_prompt) - lo - len(context.strip())
  out = pair.corrupt_prompt[lo:len(pair.corrupt_prompt) - tail]
  if format_prompt(out, pair.question) != pair.corrupt_prompt:
    raise ValueError(f'item {pair.id}: the entity swap edited the prompt outside its context')
  return out


@dataclasses.dataclass(frozen=True)
class WorldPairs:
  """The Pairs of a memorisable-prior world's items, by the kind of context."""
  with_ev: dict    # {id: the audit's pair: D+ with the evidence, D− its entity swap}
  free: dict       # {id: no-evidence pair (D− = D+, no span)}
  conflict: dict   # {id: conflicting pair: D+ = D− = the entity swap, no span}

  def of(self, row: prior_world.Row) -> audit_nq.Pair:
    """The training pair of a world row."""
    if row.conflict:
      return self.conflict[row.id]
    return self.with_ev[row.id] if row.has_evidence else self.free[row.id]


def world_pairs(tok, config: Any) -> tuple[prior_world.World, WorldPairs, dict]:
  """(world, its pairs, report) of the config's memorisable-prior world over the train
  split (`prior_world`): every scanned item whose entity-swap pair aligns and whose
  no-evidence context exists and fits is a candidate."""
  d, seed = config.data, int(config.seed)
  examples, passages = _storage()
  recs = sorted((e for e in examples if e['source'] == 'nq' and e['split'] == d.train_split),
                key=lambda e: e['id'])
  if d.max_items:
    recs = recs[:int(d.max_items)]
  pool = audit_nq.drawn_pool(tok, [(e, '') for e in recs])
  pc = _pair_config(config)
  n_ctx = int(d.n_distractor_sentences)
  items, with_ev, free, conflict, dropped = [], {}, {}, {}, {}
  for e in recs:
    passage = passages[e['passage_id']]
    ctx = short_context(e, passage, n_ctx, seed)
    pair, why = audit_nq.make_pair(tok, e, ctx, pool, pc)
    # Without evidence: as many sentences as the context with it, none naming the answer.
    free_ctx = prior_world.free_context(e['id'], passage['sentences'], e['answer'],
                                        n_ctx + 1, seed)
    item = fp = None
    if pair is not None and free_ctx is not None:
      item = prior_world.Item(e['id'], e['question'], e['answer'], ctx, free_ctx,
                              swapped_context(pair, ctx))
      fp = fixed_pair(tok, item, free_ctx, int(d.max_len))
      why = 'kept' if fp is not None else 'free_context_too_long'
    else:
      why = why if pair is None else 'no_free_context'
    if why != 'kept':
      dropped[why] = dropped.get(why, 0) + 1
      continue
    items.append(item)
    with_ev[e['id']], free[e['id']] = pair, fp
    # Token-aligned with the pair (`make_pair` checked it), so it fits whenever the pair does.
    conflict[e['id']] = fixed_pair(tok, item, item.conflict_context, int(d.max_len))
    if conflict[e['id']] is None:
      raise ValueError(f'item {e["id"]}: its entity swap is longer than data.max_len although '
                       f'its pair is token-aligned')
  world = prior_world.build(items, world_config(config), seed)
  report = {'split': d.train_split, 'scanned': len(recs), 'eligible': len(items),
            'dropped': dropped, **world.report}
  return world, WorldPairs(with_ev, free, conflict), report


def answer_end(config: Any) -> str:
  """`data.answer_end`: the text trained after every answer ('' in a config recorded
  before the field existed: those runs trained the answer alone)."""
  return str(config.data.get('answer_end', ''))


def batch_arrays(tok, pairs: Sequence[audit_nq.Pair], pad_to: int, end: str = '') -> dict:
  """The objective's batch (`cer_objective` module doc) of pairs, checked host-side.

  end: text trained after each answer (`data.answer_end`, e.g. '\\n', the evaluation's
  stop string, so the reader learns where its answer ends). It must add exactly one token
  (the rows are then padded to pad_to + 1 and n_tail covers it: the answer mask, the task
  NLL and the CER log-likelihoods include it); the probe spans keep their prompt tokens.
  ValueError naming the item when a pair's D+ and D− rows are not token-aligned
  (different token counts, or tokens differing outside the evidence span), or when the
  end merges with the answer's last token.
  """
  from ceu_jax.pretrained.tokenizer import encode_batch
  n_end = 1 if end else 0
  pad_to = pad_to + n_end
  answers = [p.answer + end for p in pairs]
  bp = encode_batch(tok, [p.clean_prompt for p in pairs], answers, pad_to=pad_to)
  bm = encode_batch(tok, [p.corrupt_prompt for p in pairs], answers, pad_to=pad_to)
  t_in = pad_to - 1
  spans = {n: np.zeros((len(pairs), t_in), bool) for n in obj.PROBES}
  for i, p in enumerate(pairs):
    if bp.prompt_len[i] != bm.prompt_len[i] or p.prompt_tokens != bp.prompt_len[i]:
      raise ValueError(f'item {p.id}: D+ and D− are not token-aligned (D+ prompt '
                       f'{bp.prompt_len[i]} tokens, D− {bm.prompt_len[i]}, pair says '
                       f'{p.prompt_tokens})')
    if bp.answer_len[i] != p.answer_tokens + n_end:
      raise ValueError(f'item {p.id}: data.answer_end {end!r} does not add exactly one token '
                       f'after the answer {p.answer!r} ({p.answer_tokens} tokens alone, '
                       f'{bp.answer_len[i]} with it)')
    off = pad_to - p.length - n_end
    for n in obj.PROBES:
      spans[n][i, off + np.asarray(getattr(p, n), int)] = True
  batch = {'tokens_p': bp.tokens, 'tokens_m': bm.tokens, 'valid': bp.valid,
           'answer_mask': bp.answer_mask, **{f'span_{n}': spans[n] for n in obj.PROBES},
           'has_ev': np.array([bool(p.ev) for p in pairs]),
           **{f'has_{n}': np.array([bool(getattr(p, n)) for p in pairs])
              for n in obj.PROBES[1:]}}
  obj.check_batch(batch, [p.id for p in pairs])
  return batch


# ----------------------------------------------------------------------------
# The task.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class SmolLM2CERTask(lora_lib.AdapterTask):
  """`CustomTask` of a smollm2_cer config (module doc)."""
  config: Any  # the validated run config
  model_config: SmolLMConfig  # the (possibly truncated) SmolLM2 hyper-parameters
  base: dict  # frozen base params (host/device arrays)
  tokenizer: Any  # the SmolLM2 tokenizer
  pairs: list  # training pairs (seeded epochs over them; a prior world: its rows)
  report: dict  # pair selection report
  world: Optional[prior_world.World] = None  # the memorisable-prior world (data.world)
  world_pairs: Optional[WorldPairs] = None  # the world's pairs by kind of context

  @classmethod
  def from_config(cls, config: Any, *, load=None) -> 'SmolLM2CERTask':
    """Validates, loads the GGUF model (or `load()` -> (model_config, params, tok)), builds
    pairs. A config recorded before eval.eps is read with the ε its evaluation used."""
    config = audit_config.upgrade(config)
    validate(config)
    if load is None:
      from ceu_jax.pretrained import load_model_and_tokenizer
      mc, variables, tok = load_model_and_tokenizer(config.model.gguf_path,
                                                    config.model.n_layers)
    else:
      mc, variables, tok = load()
    lora_lib.check_layer(config.model.read_layer, mc, 'model.read_layer')
    if world_config(config) is not None:
      world, wp, report = world_pairs(tok, config)
      return cls(config, mc, variables['params'], tok, [wp.of(r) for r in world.rows],
                 report, world, wp)
    pairs, report = build_pairs(tok, config, config.data.train_split)
    if not pairs:
      raise ValueError(f'no aligned training pairs in split {config.data.train_split!r}: '
                       f'{report}')
    return cls(config, mc, variables['params'], tok, pairs, report)

  # -- CustomTask -------------------------------------------------------------
  def validate(self, config: Any) -> None:
    validate(config)
    lora_lib.check_layer(config.model.read_layer, self.model_config, 'model.read_layer')

  @property
  def n_tail(self) -> int:
    """Trained answer positions: the longest answer, plus its end (data.answer_end)."""
    return int(self.config.data.max_answer_tokens) + (1 if answer_end(self.config) else 0)

  def loss(self, params: Any, frozen: Any, batch: dict, rng: jax.Array):
    del rng  # the probes' spans are fixed per pair
    return obj.lm_cer_loss(params, frozen, batch, config=self.model_config, lora=self.lora,
                           layer=int(self.config.model.read_layer),
                           cfg=loss_config(self.config), n_tail=self.n_tail,
                           path=str(self.config.model.cer_path))

  def batch_pairs(self, step: int, batch_size: int) -> list:
    n = len(self.pairs)
    rows = []
    for r in range(step * batch_size, (step + 1) * batch_size):
      epoch, pos = divmod(r, n)
      order = np.random.default_rng([int(self.config.seed), 0xE90C, epoch]).permutation(n)
      rows.append(self.pairs[order[pos]])
    return rows

  def train_batch(self, step: int, batch_size: int) -> dict:
    return batch_arrays(self.tokenizer, self.batch_pairs(step, batch_size),
                        int(self.config.data.max_len), end=answer_end(self.config))
