"""Factual-QA batches (docs/conventions.md §1), a pure function of (cfg, seed, index, split).

Position p = index * batch_size + r of the stream (seed, split) holds example
perm_e[p mod n] of epoch e = p // n, where perm_e is a seeded permutation of the
usable examples. example_id = SPLITS[split] * ID_STRIDE + the example's index in the
prepared split (stable across knobs and seeds), so a corruption can find the example.

D+ layout per row (numpy Generator seeded by (seed, split, p)): the evidence passage
at a random position holds the evidence clause with neighbouring sentences of its
source passage; with probability δ every other passage holds evidence-format
distractor lines (same article: HARD_SAME_ID, same relation: HARD_SAME_KEY, same
answer type: DISTRACTOR), else consecutive filler sentences of another passage; with
probability η the evidence line is left out (has_evidence False).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import numpy as np

from ceu_jax.data.factqa import items as items_lib
from ceu_jax.data.factqa import layout
from ceu_jax.data.factqa import tokenizer as tok_lib
from ceu_jax.data.factqa.config import ID_STRIDE, PREPARED_SPLIT, SPLITS, FactQAConfig
from ceu_jax.data.types import LineKind, RetrievalBatch


@dataclasses.dataclass(frozen=True)
class FactQAData:
  """One split under one config: usable examples, skipped ones (with reasons), alignment."""
  cfg: FactQAConfig
  split: str
  data: items_lib.SplitData
  usable: tuple[int, ...]                 # indices into data.items
  skipped: dict[str, tuple[str, ...]]     # reason -> record ids

  @property
  def num_examples(self) -> int:
    return len(self.usable)

  def item(self, example_id: int) -> items_lib.Item:
    return self.data.items[int(example_id) % ID_STRIDE]

  def alignment_report(self) -> dict:
    """How D+ and D− were aligned token by token (counts, and ids where not exact)."""
    its = [self.data.items[i] for i in self.usable]
    swap_pad = [it.key for it in its if it.lines.swap_padded]
    para_pad = [it.key for it in its if it.lines.paraphrase_padded]
    unaligned = self.skipped.get("evidence_line_too_long_for_passage", ())
    return {"examples": len(its),
            "entity_swap": {"equal_token_length": len(its) - len(swap_pad),
                            "padded": len(swap_pad), "padded_ids": swap_pad},
            "paraphrase": {"equal_token_length": len(its) - len(para_pad),
                           "padded": len(para_pad)},
            "unaligned": {"count": len(unaligned), "ids": list(unaligned)}}


def _skip_reason(cfg: FactQAConfig, it: items_lib.Item) -> Optional[str]:
  if len(it.question) + 1 > cfg.query_len:
    return "question_too_long_for_query_len"
  if len(it.answer) > cfg.answer_len or not it.answer:
    return "answer_too_long_for_answer_len"
  if it.lines.width > cfg.max_line_len:
    return "evidence_line_too_long_for_passage"
  return None


@functools.lru_cache(maxsize=16)
def load(cfg: FactQAConfig, split: str = "train", cache_dir: Optional[str] = None
         ) -> FactQAData:
  """The examples of `split` (train | eval | test) usable under `cfg`."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
  data = items_lib.load_split_data(PREPARED_SPLIT[split], cfg.sources, cfg.counterfactual,
                                   cfg.nq_swap, cache_dir=cache_dir)
  usable, skipped = [], {}
  for i, it in enumerate(data.items):
    reason = _skip_reason(cfg, it)
    if reason:
      skipped.setdefault(reason, []).append(it.key)
    else:
      usable.append(i)
  if not usable:
    raise ValueError(f"no factqa example fits data.context_len={cfg.context_len} / "
                     f"num_passages={cfg.num_passages}; skipped: "
                     f"{ {k: len(v) for k, v in skipped.items()} }")
  return FactQAData(cfg, split, data, tuple(usable),
                    {k: tuple(v) for k, v in sorted(skipped.items())})


def _row_rng(seed: int, split: str, position: int, salt: int = 0) -> np.random.Generator:
  return np.random.default_rng([int(seed), SPLITS[split], int(position), salt])


def stream_example(fd: FactQAData, seed: int, position: int) -> int:
  """Index (into fd.data.items) of stream position `position`."""
  n = fd.num_examples
  epoch, k = divmod(int(position), n)
  perm = np.random.default_rng([int(seed), SPLITS[fd.split], epoch, 7]).permutation(n)
  return fd.usable[int(perm[k])]


def build_row(fd: FactQAData, index: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """All RetrievalBatch fields of one example (D+) except example_id."""
  c, it, pools = fd.cfg, fd.data.items[index], fd.data.pools
  row = layout.Row.empty(c)
  has_ev = bool(rng.random() >= c.eta)
  ev_pos = int(rng.integers(c.num_passages))
  lines, ev_line = layout.evidence_passage(c, it, it.lines.plus if has_ev else None)
  starts = layout.render_passage(c, row, ev_pos, lines)
  used: set[int] = set()
  for j in range(c.num_passages):
    if j == ev_pos:
      continue
    if rng.random() < c.delta:
      other = layout.draw_distractors(c, rng, pools, it, index, used)
    else:
      other = layout.draw_filler(c, rng, pools, it)
    layout.render_passage(c, row, j, other or layout.draw_filler(c, rng, pools, it))
  evidence = np.zeros(c.context_len, bool)
  value = np.zeros(c.context_len, bool)
  if ev_line >= 0:
    s = starts[ev_line]
    evidence[s:s + it.lines.width] = True
    value[s + it.lines.value_start:s + it.lines.value_start + it.lines.value_len] = True
  distractor, hard = row.kind_masks()
  return dict(query=_pad([tok_lib.BOS, *it.question], c.query_len),
              context=row.context, passage_ids=row.passage_ids,
              answer=_pad(list(it.answer), c.answer_len), has_evidence=np.bool_(has_ev),
              evidence_mask=evidence, value_mask=value, distractor_mask=distractor,
              hard_negative_mask=hard, passage_start=row.passage_start,
              line_ids=row.line_ids, line_kind=row.line_kind,
              changed_mask=np.zeros(c.context_len, bool))


def _pad(ids: list[int], length: int) -> np.ndarray:
  out = np.zeros(length, np.int32)
  out[:len(ids)] = ids
  return out


def stack_rows(rows: list[dict[str, np.ndarray]], example_id: np.ndarray) -> RetrievalBatch:
  fields = {k: jax.device_put(np.stack([r[k] for r in rows])) for k in rows[0]}
  return RetrievalBatch(example_id=jax.device_put(np.asarray(example_id, np.int32)), **fields)


def generate_batch(cfg: FactQAConfig, seed: int, index: int, batch_size: int,
                   split: str = "train", cache_dir: Optional[str] = None) -> RetrievalBatch:
  """Batch `index` of the stream (seed, split): a pure function of its arguments."""
  if not isinstance(cfg, FactQAConfig):
    raise TypeError(f"cfg must be a FactQAConfig, got {type(cfg).__name__}")
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
  if int(index) < 0 or int(seed) < 0:
    raise ValueError(f"seed and index must be >= 0, got seed={seed}, index={index}")
  fd = load(cfg, split, cache_dir)
  rows, ids = [], []
  for r in range(batch_size):
    p = int(index) * batch_size + r
    i = stream_example(fd, seed, p)
    rows.append(build_row(fd, i, _row_rng(seed, split, p)))
    ids.append(SPLITS[split] * ID_STRIDE + i)
  return stack_rows(rows, np.asarray(ids))


def example_batch(cfg: FactQAConfig, seed: int, indices: list[int], split: str = "train",
                  cache_dir: Optional[str] = None) -> RetrievalBatch:
  """D+ rows for explicit example indices (into the prepared split), e.g. an eval set."""
  fd = load(cfg, split, cache_dir)
  usable = set(fd.usable)
  bad = [i for i in indices if i not in usable]
  if bad:
    raise ValueError(f"example indices {bad[:5]} are not usable under this config "
                     f"(see load(cfg, split).skipped)")
  rows = [build_row(fd, i, _row_rng(seed, split, i, salt=1)) for i in indices]
  return stack_rows(rows, np.asarray([SPLITS[split] * ID_STRIDE + i for i in indices]))


def decode_row(fd: FactQAData, batch: RetrievalBatch, r: int) -> dict[str, str]:
  """Human-readable query / answer / passages of row r (for show_examples and tests)."""
  tok = fd.data.tokenizer
  ctx = np.asarray(batch.context[r])
  pid = np.asarray(batch.passage_ids[r])
  passages = [tok.decode(ctx[pid == j]) for j in range(fd.cfg.num_passages)]
  kinds = np.asarray(batch.line_kind[r])
  return {"query": tok.decode(np.asarray(batch.query[r])),
          "answer": tok.decode(np.asarray(batch.answer[r])),
          "evidence": tok.decode(ctx[np.asarray(batch.evidence_mask[r])]),
          "value": tok.decode(ctx[np.asarray(batch.value_mask[r])]),
          "passages": "\n".join(passages),
          "line_kinds": " ".join(LineKind(int(k)).name for k in kinds)}
