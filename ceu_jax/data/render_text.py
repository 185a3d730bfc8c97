"""ATR-insert examples as readable text, and a text-level parser of their lines.

`show_examples(config, num)` renders the first `num` examples of a config's
fixed evaluation set: the query and gold answer, D+ with the evidence span
marked ⟦ ... ⟧, and each corruption's D− with the changed tokens marked «tok»
(the ⟦ ⟧ marks stay on E(D+)'s positions in D−).

`parse_line_text` / `parse_query_text` read lines and queries back from their
text alone (regular expressions over the rendered formats), independent of the
generator's own token-level parser; the property tests use them.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import LineKind, RetrievalBatch

EVIDENCE_OPEN, EVIDENCE_CLOSE = "⟦", "⟧"
CHANGED_OPEN, CHANGED_CLOSE = "«", "»"

_VALS = r"((?:v_\d+ )+)"
_STANDARD = re.compile(r"ID #(\d+) KEY k_(\d+) VALUE " + _VALS + r"\.")
_PARAPHRASE = re.compile(r"KEY k_(\d+) OF #(\d+) IS " + _VALS + r"\.")
_FILLER = re.compile(r"NOTE (?:\S+ )+\.")
_QUERY_VFK = re.compile(r"\[BOS\] ID #(\d+) KEY k_(\d+) VALUE")
_QUERY_KFV = re.compile(r"\[BOS\] ID #(\d+) VALUE " + _VALS + r"KEY")


def _values(text: str) -> tuple[int, ...]:
  return tuple(int(v[2:]) for v in text.split())


def parse_line_text(text: str) -> dict[str, Any]:
  """{'format': standard|paraphrase|filler, 'id', 'key', 'values'} of one line.

  Raises ValueError if the text is in none of the three line formats.
  """
  if m := _STANDARD.fullmatch(text):
    return dict(format="standard", id=int(m[1]), key=int(m[2]), values=_values(m[3]))
  if m := _PARAPHRASE.fullmatch(text):
    return dict(format="paraphrase", id=int(m[2]), key=int(m[1]), values=_values(m[3]))
  if _FILLER.fullmatch(text):
    return dict(format="filler", id=None, key=None, values=None)
  raise ValueError(f"not an ATR-insert line: {text!r}")


def parse_query_text(text: str) -> dict[str, Any]:
  """{'id', 'key', 'values'} named by a query (the asked-for field is None)."""
  if m := _QUERY_VFK.fullmatch(text):
    return dict(id=int(m[1]), key=int(m[2]), values=None)
  if m := _QUERY_KFV.fullmatch(text):
    return dict(id=int(m[1]), key=None, values=_values(m[2]))
  raise ValueError(f"not an ATR-insert query: {text!r}")


def line_positions(line_ids: np.ndarray, num_lines: int) -> np.ndarray:
  """[L, T] context positions of each line slot, from one row of `line_ids`."""
  line_ids = np.asarray(line_ids)
  return np.stack([np.nonzero(line_ids == slot)[0] for slot in range(num_lines)])


def line_texts(cfg: ATRConfig, context: np.ndarray, line_ids: np.ndarray) -> list[list[str]]:
  """[B][L] text of every line slot of a batch of contexts."""
  strings = np.asarray(cfg.vocab.token_strings())
  pos = line_positions(line_ids, cfg.num_lines)
  words = strings[np.asarray(context)[:, pos]]          # [B, L, T]
  return [[" ".join(line) for line in row] for row in words.tolist()]


# ------------------------------------------------------------------ rendering
def render_context(cfg: ATRConfig, batch: RetrievalBatch, row: int) -> str:
  """One context as text, one passage per line, E(D+) in ⟦ ⟧, changes in « »."""
  strings = cfg.vocab.token_strings()
  context = np.asarray(batch.context[row])
  evidence = np.asarray(batch.evidence_mask[row])
  changed = np.asarray(batch.changed_mask[row])
  passages, words = [], []
  for pos, tok in enumerate(context.tolist()):
    if pos and pos % cfg.passage_len == 0:
      passages.append(" ".join(words))
      words = []
    word = strings[tok]
    if changed[pos]:
      word = f"{CHANGED_OPEN}{word}{CHANGED_CLOSE}"
    if evidence[pos] and (pos == 0 or not evidence[pos - 1]):
      word = EVIDENCE_OPEN + " " + word
    if evidence[pos] and (pos + 1 == len(context) or not evidence[pos + 1]):
      word = word + " " + EVIDENCE_CLOSE
    words.append(word)
  passages.append(" ".join(words))
  return "\n".join("    " + p for p in passages)


def render_example(cfg: ATRConfig, plus: RetrievalBatch,
                   minus: Mapping[str, RetrievalBatch], row: int) -> str:
  """Query, answer, D+ and every D− of example `row` as text."""
  vocab = cfg.vocab
  ev_kind = int(LineKind.EVIDENCE)
  lines = [f"example {int(plus.example_id[row])}: query  {vocab.decode(plus.query[row])}",
           f"  gold answer: {vocab.decode(plus.answer[row])}   "
           f"has_evidence: {bool(plus.has_evidence[row])}   "
           f"evidence slot: {_slot(plus.line_kind[row], ev_kind)}",
           "  D+:", render_context(cfg, plus, row)]
  for name, batch in minus.items():
    n_changed = int(np.asarray(batch.changed_mask[row]).sum())
    lines += [f"  D- {name} (changed tokens: {n_changed}, "
              f"has_evidence: {bool(batch.has_evidence[row])}):",
              render_context(cfg, batch, row)]
  return "\n".join(lines)


def _slot(line_kind: np.ndarray, kind: int) -> str:
  hits = np.nonzero(np.asarray(line_kind) == kind)[0]
  return str(int(hits[0])) if hits.size else "none"


def render_examples(cfg: ATRConfig, plus: RetrievalBatch,
                    minus: Mapping[str, RetrievalBatch], num: int = 3) -> str:
  """The first `num` examples, separated by blank lines."""
  legend = (f"legend: {EVIDENCE_OPEN} ... {EVIDENCE_CLOSE} evidence span E(D+); "
            f"{CHANGED_OPEN}tok{CHANGED_CLOSE} token changed by the corruption")
  rows = range(min(num, plus.batch_size))
  return "\n\n".join([legend] + [render_example(cfg, plus, minus, r) for r in rows])


def show_examples(config: Any, num: int = 3,
                  names: Sequence[str] | None = None) -> str:
  """Text of the first `num` examples of the config's evaluation set (all
  corruptions unless `names`); `config` is a full experiment ConfigDict."""
  from ceu_jax.data import corruptions, evalsets
  cfg = ATRConfig.from_config(config.data)
  names = tuple(names or corruptions.CORRUPTIONS)
  seed = int(config.eval.seed) if "eval" in config else 0
  plus, minus = evalsets.eval_batches(cfg, seed, num, names)
  return render_examples(cfg, plus, minus, num)
