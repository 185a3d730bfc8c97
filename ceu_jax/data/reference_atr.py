"""A straightforward pure-Python ATR-insert generator (plain `random`, no JAX).

It samples the same distribution as `ceu_jax.data.atr` (SPEC §3) one example at
a time with Python lists, and is the baseline of `benchmarks/data_bench.py` and
the independent reference of the distribution tests. It is NOT bit-identical
to the JAX generator (different random streams; its ρ prior table is drawn from
`random.Random(world_seed)`), only equal in distribution.

`generate(cfg, seed, num_examples)` returns a dict of numpy arrays with the
fields of `RetrievalBatch` (docs/conventions.md §1).
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np

from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import LineKind

EV, DIS, FILL = int(LineKind.EVIDENCE), int(LineKind.DISTRACTOR), int(LineKind.FILLER)
SAME_KEY, SAME_ID = int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID)
VALUE_OFFSET = 5


def _other(rng: random.Random, x: int, n: int) -> int:
  """Uniform draw from {0..n-1} without x."""
  y = rng.randrange(n - 1)
  return y + 1 if y >= x else y


def prior_table(cfg: ATRConfig) -> dict[tuple[int, int], list[int]]:
  """(ID, KEY) -> fixed values for the share ρ of pairs that are fixed."""
  rng = random.Random(cfg.world_seed)
  table = {}
  for i in range(cfg.n_ids):
    for k in range(cfg.n_keys):
      fixed = rng.random() < cfg.rho
      vals = [rng.randrange(cfg.n_values) for _ in range(cfg.value_len)]
      if fixed:
        table[(i, k)] = vals
  return table


class ReferenceATR:
  """Pure-Python ATR-insert sampler for one config."""

  def __init__(self, cfg: ATRConfig):
    self.cfg = cfg
    self.vocab = cfg.vocab
    self.prior = prior_table(cfg) if cfg.rho > 0 else {}

  # ------------------------------------------------------------ sampling
  def _kind(self, rng: random.Random) -> int:
    cfg = self.cfg
    if rng.random() < cfg.delta:
      if cfg.hard_negative_kinds == "both":
        return SAME_KEY if rng.random() < 0.5 else SAME_ID
      return SAME_KEY if cfg.hard_negative_kinds == "same_key" else SAME_ID
    return FILL if rng.random() < cfg.filler_rate else DIS

  def _values(self, rng: random.Random) -> list[int]:
    return [rng.randrange(self.cfg.n_values) for _ in range(self.cfg.value_len)]

  def _fields(self, rng, kind, q_id, q_key, q_vals):
    """(id, key, values) of one evidence-format line of the given kind."""
    cfg = self.cfg
    line_id = q_id if kind in (EV, SAME_ID) else _other(rng, q_id, cfg.n_ids)
    if cfg.variant == "value_for_key":
      key = q_key if kind in (EV, SAME_KEY) else _other(rng, q_key, cfg.n_keys)
      vals = q_vals if kind == EV else self.prior.get((line_id, key)) or self._values(rng)
      return line_id, key, vals
    key = q_key if kind == EV else _other(rng, q_key, cfg.n_keys)
    if kind in (EV, SAME_KEY):
      return line_id, key, q_vals
    vals = [_other(rng, q_vals[0], cfg.n_values)] + self._values(rng)[1:]
    return line_id, key, vals

  def _filler(self, rng, overlap: tuple[int, int]) -> list[int]:
    cfg, v = self.cfg, self.vocab
    n_words = cfg.line_len - 2
    words = [v.filler_base + rng.randrange(cfg.n_filler) for _ in range(n_words)]
    if rng.random() < cfg.overlap_rate:
      p1 = rng.randrange(n_words)
      p2 = _other(rng, p1, n_words)
      words[p1], words[p2] = overlap
    return [v.tok("NOTE")] + words + [v.tok(".")]

  def _line(self, rng, kind, q_id, q_key, q_vals, overlap) -> tuple[list[int], bool]:
    """(tokens, paraphrased) of one line."""
    v = self.vocab
    if kind == FILL:
      return self._filler(rng, overlap), False
    line_id, key, vals = self._fields(rng, kind, q_id, q_key, q_vals)
    id_tok, key_tok = v.id_base + line_id, v.key_base + key
    val_toks = [v.value_base + x for x in vals]
    if rng.random() < self.cfg.paraphrase_rate:
      head = [v.tok("KEY"), key_tok, v.tok("OF"), id_tok, v.tok("IS")]
      return head + val_toks + [v.tok(".")], True
    head = [v.tok("ID"), id_tok, v.tok("KEY"), key_tok, v.tok("VALUE")]
    return head + val_toks + [v.tok(".")], False

  def _query(self, q_id, q_key, q_vals) -> tuple[list[int], list[int]]:
    v = self.vocab
    t = v.tok
    id_tok, key_tok = v.id_base + q_id, v.key_base + q_key
    val_toks = [v.value_base + x for x in q_vals]
    if self.cfg.variant == "value_for_key":
      return [t("[BOS]"), t("ID"), id_tok, t("KEY"), key_tok, t("VALUE")], val_toks
    return [t("[BOS]"), t("ID"), id_tok, t("VALUE")] + val_toks + [t("KEY")], [key_tok]

  def example(self, rng: random.Random) -> dict[str, Any]:
    """One example as a dict of Python lists / scalars."""
    cfg, v = self.cfg, self.vocab
    q_id, q_key = rng.randrange(cfg.n_ids), rng.randrange(cfg.n_keys)
    q_vals = self.prior.get((q_id, q_key)) or self._values(rng)
    has_evidence = rng.random() >= cfg.eta
    ev_line = rng.randrange(cfg.num_lines)
    kinds = [self._kind(rng) for _ in range(cfg.num_lines)]
    kinds[ev_line] = EV if has_evidence else DIS
    second = v.key_base + q_key if cfg.variant == "value_for_key" else v.value_base + q_vals[0]
    overlap = (v.id_base + q_id, second)
    lines = [self._line(rng, k, q_id, q_key, q_vals, overlap) for k in kinds]
    query, answer = self._query(q_id, q_key, q_vals)
    ex = self._assemble(kinds, lines, ev_line, has_evidence)
    ex.update(query=query, answer=answer, has_evidence=has_evidence, line_kind=kinds)
    return ex

  # ------------------------------------------------------------ layout
  def _assemble(self, kinds, lines, ev_line, has_evidence) -> dict[str, list]:
    """Context tokens and per-token masks from the lines, passage by passage."""
    cfg, v = self.cfg, self.vocab
    context, passage_ids, starts, line_ids = [], [], [], []
    ev_mask, val_mask, dis_mask, hard_mask = [], [], [], []
    per_passage = cfg.lines_per_passage
    for p in range(cfg.num_passages):
      context.append(v.tok("[P]"))
      line_ids.append(-1)
      for slot in range(p * per_passage, (p + 1) * per_passage):
        tokens, paraphrased = lines[slot]
        context.extend(tokens)
        line_ids.extend([slot] * cfg.line_len)
      pad = cfg.passage_len - 1 - per_passage * cfg.line_len
      context.extend([v.tok("[FILL]")] * pad)
      line_ids.extend([-1] * pad)
      passage_ids.extend([p] * cfg.passage_len)
      starts.extend([True] + [False] * (cfg.passage_len - 1))
    answer_offsets = self._answer_offsets(lines[ev_line][1])
    for pos, slot in enumerate(line_ids):
      kind = kinds[slot] if slot >= 0 else -1
      on_ev = has_evidence and slot == ev_line
      ev_mask.append(on_ev)
      offset = (pos % cfg.passage_len - 1) % cfg.line_len
      val_mask.append(on_ev and offset in answer_offsets)
      dis_mask.append(kind == DIS)
      hard_mask.append(kind in (SAME_KEY, SAME_ID))
    return dict(context=context, passage_ids=passage_ids, passage_start=starts,
                line_ids=line_ids, evidence_mask=ev_mask, value_mask=val_mask,
                distractor_mask=dis_mask, hard_negative_mask=hard_mask,
                changed_mask=[False] * cfg.context_len)

  def _answer_offsets(self, paraphrased: bool) -> set[int]:
    if self.cfg.variant == "value_for_key":
      return set(range(VALUE_OFFSET, VALUE_OFFSET + self.cfg.value_len))
    return {1 if paraphrased else 3}


_DTYPES = dict(query=np.int32, context=np.int32, passage_ids=np.int32, answer=np.int32,
               has_evidence=bool, evidence_mask=bool, value_mask=bool,
               distractor_mask=bool, hard_negative_mask=bool, passage_start=bool,
               line_ids=np.int32, line_kind=np.int32, changed_mask=bool)


def generate(cfg: ATRConfig, seed: int, num_examples: int,
             sampler: ReferenceATR | None = None) -> dict[str, np.ndarray]:
  """`num_examples` examples as numpy arrays with the RetrievalBatch fields."""
  sampler = sampler or ReferenceATR(cfg)
  rng = random.Random(seed)
  examples = [sampler.example(rng) for _ in range(num_examples)]
  out = {name: np.asarray([ex[name] for ex in examples], dtype)
         for name, dtype in _DTYPES.items()}
  out["example_id"] = np.arange(num_examples, dtype=np.int32)
  return out
