"""Prepared records -> tokenized items and line pools (host side, numpy-free lists).

An item holds the token ids of everything a batch or a corruption may place in the
context for one example: the evidence line in its D+, entity-swap and paraphrase
renderings (all of the same width, see `EvidenceLines`), the other sentences of
its passage, and the strings used to keep the answer out of filler lines.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Optional

from ceu_jax.data.factqa import builder, storage
from ceu_jax.data.factqa import tokenizer as tok_lib
from ceu_jax.data.types import LineKind

PAD = tok_lib.PAD


@dataclasses.dataclass(frozen=True)
class EvidenceLines:
  """Token-aligned renderings of the evidence line, each `width` tokens long.

  plus = prefix | answer + pad | suffix (+ pad); swap = prefix | substitute + pad |
  suffix (+ pad): the mention slot has the width of the longer of the two, so prefix,
  mention and suffix sit at identical positions. paraphrase is right-padded to width.
  """
  plus: tuple[int, ...]
  swap: tuple[int, ...]
  paraphrase: tuple[int, ...]
  value_start: int   # offset of the answer mention in `plus`
  value_len: int     # number of answer tokens (without pads)
  swap_padded: bool  # answer and substitute differ in token count
  paraphrase_padded: bool

  @property
  def width(self) -> int:
    return len(self.plus)


@dataclasses.dataclass(frozen=True)
class Item:
  """One tokenized example."""
  key: str                 # the record id, e.g. 'squad:56be4db0acb8001400a502ec'
  source: str
  answer_type: str
  relation: str
  passage_id: str
  title: str
  answer_text: str
  question: tuple[int, ...]
  answer: tuple[int, ...]
  lines: EvidenceLines
  neighbours: tuple[tuple[int, ...], ...]  # other sentences of the passage, in order
  evidence_index: int      # where the evidence sits among the neighbours (insert point)
  banned: tuple[str, ...]  # lower-cased strings no filler / distractor line may contain
  line_text: str           # the D+ evidence clause (as rendered)


def _pad(ids: list[int], width: int) -> tuple[int, ...]:
  return tuple(ids + [PAD] * (width - len(ids)))


def evidence_lines(pre: list[int], ans: list[int], suf: list[int], sub: list[int],
                   para: list[int]) -> EvidenceLines:
  """Align D+ / swap / paraphrase renderings of one evidence line (see EvidenceLines)."""
  slot = max(len(ans), len(sub))
  plus = pre + ans + [PAD] * (slot - len(ans)) + suf
  swap = pre + sub + [PAD] * (slot - len(sub)) + suf
  width = max(len(plus), len(para))
  return EvidenceLines(_pad(plus, width), _pad(swap, width), _pad(para, width), len(pre),
                       len(ans), len(ans) != len(sub), len(para) != len(pre + ans + suf))


def _texts(rec: dict[str, Any], counterfactual: bool, nq_swap: str) -> dict[str, str]:
  """The strings of one record in factual or counterfactual (invented-name) form."""
  ans, ev, c = rec["answer"], rec["evidence"], rec["answer_char"]
  name = rec["cf_answer"] if counterfactual else ans
  sub = rec["swap_equal"] if nq_swap == "equal_length" and rec.get("swap_equal") else rec["swap"]
  sub = rec["cf_swap"] if counterfactual else sub
  para = rec["paraphrase"]
  if counterfactual:
    k = para.find(ans)
    para = para[:k] + name + para[k + len(ans):] if k >= 0 else para
  return {"pre": ev[:c], "ans": name, "suf": ev[c + len(ans):], "sub": sub or name,
          "para": para, "line": ev[:c] + name + ev[c + len(ans):]}


def make_items(records: list[dict[str, Any]], tok: tok_lib.FactTokenizer,
               counterfactual: bool, nq_swap: str = "dataset") -> list[Item]:
  """Tokenize records (in order) into items."""
  texts = [_texts(r, counterfactual, nq_swap) for r in records]
  fields = ("pre", "ans", "suf", "sub", "para")
  flat = [t[f] for t in texts for f in fields]
  enc = tok.encode_batch(flat)
  qs = tok.encode_batch([r["question"] for r in records])
  out = []
  for i, (rec, t) in enumerate(zip(records, texts)):
    pre, ans, suf, sub, para = enc[i * len(fields):(i + 1) * len(fields)]
    banned = tuple(sorted({s.lower() for s in (rec["answer"], t["ans"], t["sub"]) if s}))
    sents = rec["passage"]
    keep = [j for j in range(len(sents)) if j != rec["sentence_index"]
            and not any(b in sents[j].lower() for b in banned)]
    neigh = tok.encode_batch([sents[j] for j in keep])
    out.append(Item(
        key=rec["id"], source=rec["source"], answer_type=rec["answer_type"],
        relation=rec["relation"], passage_id=rec["passage_id"],
        title=rec["passage_id"].rsplit(":", 1)[0] if rec["source"] == "squad"
        else rec["passage_id"],
        answer_text=t["ans"], question=tuple(qs[i]), answer=tuple(ans),
        lines=evidence_lines(pre, ans, suf, sub, para), neighbours=tuple(map(tuple, neigh)),
        evidence_index=sum(1 for j in keep if j < rec["sentence_index"]), banned=banned,
        line_text=t["line"]))
  return out


@dataclasses.dataclass(frozen=True)
class PoolLine:
  """A candidate non-evidence line: its tokens, text (lower-cased) and provenance."""
  ids: tuple[int, ...]
  text: str
  title: str
  answer_type: str
  relation: str


@dataclasses.dataclass(frozen=True)
class Pools:
  """Filler sentences and evidence-format lines of the whole split."""
  filler: tuple[PoolLine, ...]    # every passage sentence (passage order)
  evidence: tuple[PoolLine, ...]  # every item's evidence line (D+ form, unpadded)
  by_type: dict[str, tuple[int, ...]]
  by_relation: dict[str, tuple[int, ...]]
  by_title: dict[str, tuple[int, ...]]


def make_pools(records: list[dict[str, Any]], items: list[Item],
               tok: tok_lib.FactTokenizer) -> Pools:
  seen, sents = set(), []
  for rec, it in zip(records, items):
    if rec["passage_id"] not in seen:
      seen.add(rec["passage_id"])
      sents.extend((s, it.title) for s in rec["passage"])
  enc = tok.encode_batch([s for s, _ in sents])
  filler = tuple(PoolLine(tuple(e), s.lower(), t, "", "") for e, (s, t) in zip(enc, sents))
  evidence = tuple(PoolLine(tuple(i for i in it.lines.plus[:_unpadded(it)]),
                            it.line_text.lower(), it.title, it.answer_type, it.relation)
                   for it in items)
  return Pools(filler, evidence, _index(evidence, "answer_type"),
               _index(evidence, "relation"), _index(evidence, "title"))


def _unpadded(it: Item) -> int:
  n = len(it.lines.plus)
  while n > 0 and it.lines.plus[n - 1] == PAD:
    n -= 1
  return n


def _index(lines: tuple[PoolLine, ...], attr: str) -> dict[str, tuple[int, ...]]:
  out: dict[str, list[int]] = {}
  for i, line in enumerate(lines):
    out.setdefault(getattr(line, attr), []).append(i)
  return {k: tuple(v) for k, v in out.items()}


@dataclasses.dataclass(frozen=True)
class SplitData:
  """Items (stable order: example_id = index) and pools of one split."""
  split: str
  counterfactual: bool
  items: tuple[Item, ...]
  pools: Pools
  tokenizer: tok_lib.FactTokenizer


@functools.lru_cache(maxsize=8)
def load_split_data(split: str, sources: tuple[str, ...], counterfactual: bool,
                    nq_swap: str = "dataset", shipped_dir: str = str(storage.SHIPPED_DIR),
                    cache_dir: Optional[str] = None) -> SplitData:
  """Read a split through tfds, keep `sources` (and the nameable slice if counterfactual)."""
  records = builder.load_split(split, pathlib.Path(shipped_dir),
                               pathlib.Path(cache_dir) if cache_dir else None)
  records = [r for r in records if r["source"] in sources
             and (not counterfactual or r.get("cf_answer"))]
  tok = tok_lib.shipped_tokenizer(shipped_dir)
  items = make_items(records, tok, counterfactual, nq_swap)
  return SplitData(split, counterfactual, tuple(items), make_pools(records, items, tok), tok)


EVIDENCE_FORMAT_KINDS = (LineKind.HARD_SAME_ID, LineKind.HARD_SAME_KEY, LineKind.DISTRACTOR)
