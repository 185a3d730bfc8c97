"""Property tests of the ATR-insert generator over 2,048 examples per config.

Configs (tests/conftest.py ATR_CONFIGS) span several (η, δ, n), both variants,
answer lengths 1-3 and tiny vocabularies. Every line is read back from its text
(ceu_jax.data.render_text, regular expressions), not with the generator's parser.
"""
from __future__ import annotations

import numpy as np
import pytest

from ceu_jax.data import render_text
from ceu_jax.data.types import LineKind
from tests.conftest import ATR_CONFIGS

NUM = 2048
EV, DIS, FILL = int(LineKind.EVIDENCE), int(LineKind.DISTRACTOR), int(LineKind.FILLER)
SAME_KEY, SAME_ID = int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID)

pytestmark = pytest.mark.parametrize("name", sorted(ATR_CONFIGS))


def parsed(cfg, batch):
  """(queries [B] dicts, lines [B][L] dicts) parsed from text."""
  vocab = cfg.vocab
  queries = [render_text.parse_query_text(vocab.decode(q)) for q in batch.query]
  texts = render_text.line_texts(cfg, batch.context, batch.line_ids[0])
  lines = [[render_text.parse_line_text(t) for t in row] for row in texts]
  return queries, lines


def matches_query(cfg, query, line) -> bool:
  """The line names the query's two given fields (ID and KEY, or ID and VALUE)."""
  if line["format"] == "filler" or line["id"] != query["id"]:
    return False
  if cfg.variant == "value_for_key":
    return line["key"] == query["key"]
  return line["values"] == query["values"]


def _shares_second(cfg, query, line) -> bool:
  if cfg.variant == "value_for_key":
    return line["key"] == query["key"]
  return line["values"] == query["values"]


def test_layout_and_shapes(name, atr_data):
  cfg = ATR_CONFIGS[name]
  b = atr_data(cfg, NUM)
  n, lp = cfg.context_len, cfg.passage_len
  assert b.context.shape == (NUM, n) and b.line_kind.shape == (NUM, cfg.num_lines)
  assert b.query.shape == (NUM, cfg.query_len) and b.answer.shape == (NUM, cfg.answer_len)
  pos = np.arange(n)
  np.testing.assert_array_equal(b.passage_ids, np.broadcast_to(pos // lp, (NUM, n)))
  np.testing.assert_array_equal(b.passage_start, np.broadcast_to(pos % lp == 0, (NUM, n)))
  assert (b.context[:, ::lp] == cfg.vocab.tok("[P]")).all()
  assert not b.changed_mask.any()
  np.testing.assert_array_equal(b.example_id, np.arange(NUM))


def test_exactly_one_evidence_line_and_answer_recovered(name, atr_data):
  """One line names the query's (ID, KEY) [or (ID, VALUE)] iff has_evidence; parsing
  it recovers the gold answer; masks and kinds point at it."""
  cfg = ATR_CONFIGS[name]
  b = atr_data(cfg, NUM)
  queries, lines = parsed(cfg, b)
  answers = [cfg.vocab.decode(a) for a in b.answer]
  pos = render_text.line_positions(b.line_ids[0], cfg.num_lines)
  for r in range(NUM):
    hits = [s for s, line in enumerate(lines[r]) if matches_query(cfg, queries[r], line)]
    assert len(hits) == int(b.has_evidence[r]), (r, hits)
    np.testing.assert_array_equal(b.line_kind[r] == EV, np.isin(np.arange(cfg.num_lines), hits))
    if not hits:
      assert not b.evidence_mask[r].any() and not b.value_mask[r].any()
      continue
    line = lines[r][hits[0]]
    if cfg.variant == "value_for_key":
      recovered = " ".join(f"v_{v}" for v in line["values"])
    else:
      recovered = f"k_{line['key']}"
    assert recovered == answers[r]
    expected = np.zeros(cfg.context_len, bool)
    expected[pos[hits[0]]] = True
    np.testing.assert_array_equal(b.evidence_mask[r], expected)
    assert cfg.vocab.decode(b.context[r][b.value_mask[r]]) == answers[r]


def check_kinds_match_content(cfg, b, queries=None, lines=None):
  """Filler / distractor / hard-negative lines are what their kind says; the
  distractor and hard-negative masks are the tokens of those lines."""
  if lines is None:
    queries, lines = parsed(cfg, b)
  for r in range(b.batch_size):
    q = queries[r]
    for slot, line in enumerate(lines[r]):
      kind = b.line_kind[r, slot]
      assert (line["format"] == "filler") == (kind == FILL), (r, slot, line)
      if kind in (FILL, EV):
        continue
      same_id, same_second = line["id"] == q["id"], _shares_second(cfg, q, line)
      assert (same_id, same_second) == {DIS: (False, False), SAME_ID: (True, False),
                                        SAME_KEY: (False, True)}[kind], (r, slot, kind)
  pos = render_text.line_positions(b.line_ids[0], cfg.num_lines)
  token_kind = np.full(b.context.shape, -1)
  token_kind[:, pos] = b.line_kind[:, :, None]
  np.testing.assert_array_equal(b.distractor_mask, token_kind == DIS)
  np.testing.assert_array_equal(b.hard_negative_mask, np.isin(token_kind, [SAME_KEY, SAME_ID]))


def test_line_kinds_match_line_content(name, atr_data):
  cfg = ATR_CONFIGS[name]
  check_kinds_match_content(cfg, atr_data(cfg, NUM))


def _within_3_sigma(count: int, trials: int, p: float) -> bool:
  sigma = np.sqrt(trials * p * (1 - p))
  return abs(count - trials * p) <= 3 * sigma + 1e-9


def test_miss_rate_and_hard_negative_rate(name, atr_data):
  """Empirical miss rate within 3σ of η; hard-negative share within 3σ of δ."""
  cfg = ATR_CONFIGS[name]
  b = atr_data(cfg, NUM)
  misses = int((~b.has_evidence).sum())
  assert _within_3_sigma(misses, NUM, cfg.eta), (misses / NUM, cfg.eta)
  # Every slot but the (possibly missing) evidence slot is hard w.p. δ.
  hard = int(np.isin(b.line_kind, [SAME_KEY, SAME_ID]).sum())
  assert _within_3_sigma(hard, NUM * (cfg.num_lines - 1), cfg.delta), (hard, cfg.delta)
