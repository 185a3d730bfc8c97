"""Factual-QA corruptions C: D+ -> D− on the retrieved side, all token-aligned.

Same contract as the ATR-insert corruptions (ceu_jax/data/corruptions.py):
`corrupt(cfg, batch, name, key)` is a pure function of its arguments; row r draws
from (key, example_id[r]). D− has the length of D+ and every line at its D+
positions; `changed_mask` marks the changed tokens.

- evidence_mask / value_mask keep pointing at E(D+), so span patches address the
  same positions in both runs;
- context, line_kind, distractor_mask, hard_negative_mask describe D−;
- has_evidence: False after entity_swap, evidence_swap and removal; unchanged by
  distractor_injection and paraphrase;
- rows without evidence are returned unchanged by the evidence corruptions.

entity_swap puts the prepared substitute (NQ: the dataset's own swapped entity;
SQuAD: a same-type answer from another article; counterfactual slice: another
invented name) into the mention slot; the slot has the width of the longer of the
two names, so prefix and suffix stay at their positions (see items.EvidenceLines).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import numpy as np

from ceu_jax.data.factqa import layout, stream
from ceu_jax.data.factqa import tokenizer as tok_lib
from ceu_jax.data.factqa.config import ID_STRIDE, FactQAConfig
from ceu_jax.data.types import LineKind, RetrievalBatch

CORRUPTIONS = ("entity_swap", "evidence_swap", "removal", "distractor_injection",
               "paraphrase")
ALIASES = {"value_swap": "entity_swap"}   # the ATR-insert name of the same operation
_SPLIT_OF_CODE = {0: "train", 1: "eval", 2: "test"}
_FIELDS = ("context", "line_kind", "has_evidence", "distractor_mask", "hard_negative_mask",
           "changed_mask")


def _key_words(key: Any) -> list[int]:
  """Integers identifying a jax PRNG key (or an int seed)."""
  if isinstance(key, (int, np.integer)):
    return [int(key)]
  arr = np.asarray(jax.random.key_data(key) if jax.dtypes.issubdtype(
      getattr(key, "dtype", np.int32), jax.dtypes.prng_key) else key)
  return [int(x) for x in arr.astype(np.uint32).ravel()]


def _evidence_span(ev_mask: np.ndarray) -> Optional[tuple[int, int]]:
  pos = np.nonzero(ev_mask)[0]
  return (int(pos[0]), int(pos[-1]) + 1) if pos.size else None


def _set_line(row: dict, span: tuple[int, int], ids, kind: Optional[LineKind]) -> None:
  lo, hi = span
  row["context"][lo:hi] = ids
  if kind is not None:
    row["line_kind"][row["line_ids"][lo]] = int(kind)


def _entity_swap(fd, item, row, span, rng) -> None:
  del fd, rng
  _set_line(row, span, item.lines.swap, None)
  row["has_evidence"] = False


def _paraphrase(fd, item, row, span, rng) -> None:
  del fd, rng
  _set_line(row, span, item.lines.paraphrase, None)


def _fitting_line(lines, width: int, item, rng: np.random.Generator):
  """A pool line of another passage, at most `width` tokens, without the answer,
  right-padded to width (all PAD if 256 draws find none)."""
  for _ in range(256):
    line = lines[int(rng.integers(len(lines)))]
    if (0 < len(line.ids) <= width and line.title != item.title
        and not any(b in line.text for b in item.banned)):
      return tuple(line.ids) + (tok_lib.PAD,) * (width - len(line.ids))
  return (tok_lib.PAD,) * width


def _removal(fd, item, row, span, rng) -> None:
  """The evidence line -> a filler sentence of another passage (padded to its width)."""
  _set_line(row, span, _fitting_line(fd.data.pools.filler, span[1] - span[0], item, rng),
            LineKind.FILLER)
  row["has_evidence"] = False


def _evidence_swap(fd, item, row, span, rng) -> None:
  """The evidence line -> an evidence-format line of another example with the same
  relation (else the same answer type), padded to the evidence width."""
  pools = fd.data.pools
  cands = [i for i in pools.by_relation.get(item.relation, ())
           if pools.evidence[i].title != item.title]
  kind = LineKind.HARD_SAME_KEY
  if not cands:
    cands = [i for i in pools.by_type.get(item.answer_type, ())
             if pools.evidence[i].title != item.title]
    kind = LineKind.DISTRACTOR
  lines = [pools.evidence[i] for i in cands] or list(pools.filler)
  _set_line(row, span, _fitting_line(lines, span[1] - span[0], item, rng), kind)
  row["has_evidence"] = False


def _injection(fd, item, row, span, rng, delta: float, index: int) -> None:
  """Each passage without evidence-format lines -> distractor lines, w.p. δ."""
  c = fd.cfg
  ev_passage = int(row["passage_ids"][span[0]]) if span else -1
  used: set[int] = set()
  lpp = c.lines_per_passage
  for j in range(c.num_passages):
    kinds = row["line_kind"][j * lpp:(j + 1) * lpp]
    if j == ev_passage or np.any(kinds != int(LineKind.FILLER)) or rng.random() >= delta:
      continue
    lines = layout.draw_distractors(c, rng, fd.data.pools, item, index, used)
    if lines:
      view = layout.Row(row["context"], row["passage_ids"], row["passage_start"],
                        row["line_ids"], row["line_kind"])
      layout.render_passage(c, view, j, lines)


_PER_EXAMPLE: dict[str, Callable] = {
    "entity_swap": _entity_swap, "evidence_swap": _evidence_swap, "removal": _removal,
    "paraphrase": _paraphrase}


def _corrupt_row(fd, name: str, row: dict, example_id: int, key_words: list[int],
                 delta: Optional[float]) -> None:
  index = int(example_id) % ID_STRIDE
  item = fd.data.items[index]
  rng = np.random.default_rng(key_words + [int(example_id), CORRUPTIONS.index(name)])
  span = _evidence_span(row["evidence_mask"])
  if name == "distractor_injection":
    _injection(fd, item, row, span, rng, delta, index)
    return
  if span is None or not row["has_evidence"] or row["line_ids"][span[0]] < 0:
    return
  if span[1] - span[0] != item.lines.width:
    raise ValueError(f"example {item.key}: evidence span has {span[1] - span[0]} tokens, "
                     f"expected {item.lines.width} (batch from another config?)")
  _PER_EXAMPLE[name](fd, item, row, span, rng)


def corrupt(cfg: FactQAConfig, batch: RetrievalBatch, name: str, key: Any,
            delta: Optional[float] = None, cache_dir: Optional[str] = None) -> RetrievalBatch:
  """Apply corruption `name` (one of CORRUPTIONS, or 'value_swap') to a D+ batch -> D−.

  `key` is a jax PRNG key or an int; `delta` in [0, 1] is used by
  distractor_injection and defaults to cfg.delta.
  """
  name = ALIASES.get(name, name)
  if name not in CORRUPTIONS:
    raise ValueError(f"corruption must be one of {CORRUPTIONS + tuple(ALIASES)}, got {name!r}")
  if name == "distractor_injection":
    delta = cfg.delta if delta is None else delta
    if (not isinstance(delta, (int, float)) or isinstance(delta, bool)
        or not 0.0 <= delta <= 1.0):
      raise ValueError(f"distractor_injection delta must be in [0, 1], got {delta!r}")
  fields = {f: np.array(getattr(batch, f)) for f in batch.__dataclass_fields__}
  ids = fields["example_id"]
  codes = set((ids // ID_STRIDE).tolist())
  if len(codes) != 1 or next(iter(codes)) not in _SPLIT_OF_CODE:
    raise ValueError(f"batch.example_id must come from one factqa split, got codes {codes}")
  fd = stream.load(cfg, _SPLIT_OF_CODE[next(iter(codes))], cache_dir)
  words = _key_words(key)
  before = fields["context"].copy()
  for r in range(ids.shape[0]):
    row = {f: v[r] for f, v in fields.items()}
    _corrupt_row(fd, name, row, int(ids[r]), words, delta)
    fields["has_evidence"][r] = row["has_evidence"]
    view = layout.Row(row["context"], row["passage_ids"], row["passage_start"],
                      row["line_ids"], row["line_kind"])
    fields["distractor_mask"][r], fields["hard_negative_mask"][r] = view.kind_masks()
  fields["changed_mask"] = fields["changed_mask"] | (fields["context"] != before)
  return batch.replace(**{f: jax.device_put(fields[f]) for f in _FIELDS})


def entity_swap(cfg, batch, key):
  """The answer mention -> a same-type entity (aligned mention slot)."""
  return corrupt(cfg, batch, "entity_swap", key)


def evidence_swap(cfg, batch, key):
  """The evidence line -> an evidence-format line of another example (same relation)."""
  return corrupt(cfg, batch, "evidence_swap", key)


def removal(cfg, batch, key):
  """The evidence line -> a filler sentence of another passage (padded to its width)."""
  return corrupt(cfg, batch, "removal", key)


def distractor_injection(cfg, batch, key, delta=None):
  """Passages without evidence-format lines -> distractor lines with probability δ."""
  return corrupt(cfg, batch, "distractor_injection", key, delta)


def paraphrase(cfg, batch, key):
  """The evidence line reworded (deterministic rules), same answer, padded to its width."""
  return corrupt(cfg, batch, "paraphrase", key)
