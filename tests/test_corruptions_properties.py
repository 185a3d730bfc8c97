"""Token-aligned corruptions D+ -> D− (SPEC §3) over 1,024 examples, both variants.

D− has the same length as D+, is identical outside `changed_mask`, keeps the
evidence span at the same positions, changes only inside the corruption's span,
and — read back from its text — says what the corruption promises.
"""
from __future__ import annotations

import numpy as np
import pytest

from ceu_jax.data import corruptions
from ceu_jax.data.types import LineKind
from tests.conftest import ATR_CONFIGS
from tests.test_atr_properties import check_kinds_match_content, matches_query, parsed

NUM = 1024
CONFIGS = ("vfk_n128", "kfv_n256")
EVIDENCE_CORRUPTIONS = ("value_swap", "evidence_swap", "removal", "paraphrase")
SAME = ("query", "answer", "passage_ids", "passage_start", "line_ids", "evidence_mask",
        "value_mask", "example_id")


def _pair(cfg_name, corruption, atr_data, atr_corrupted):
  cfg = ATR_CONFIGS[cfg_name]
  return cfg, atr_data(cfg, NUM), atr_corrupted(cfg, NUM, corruption)


def _allowed_span(cfg, corruption, plus):
  """[B, N] positions the corruption may change."""
  if corruption == "value_swap":
    return plus.value_mask
  if corruption in ("evidence_swap", "paraphrase"):
    return plus.evidence_mask
  if corruption == "removal":
    first_ev = plus.evidence_mask.argmax(1)
    ev_passage = np.where(plus.evidence_mask.any(1),
                          plus.passage_ids[np.arange(NUM), first_ev], -1)
    return plus.passage_ids == ev_passage[:, None]
  return (plus.line_ids >= 0) & ~plus.evidence_mask        # distractor_injection


@pytest.mark.parametrize("corruption", corruptions.CORRUPTIONS)
@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_aligned_and_changed_only_inside_span(cfg_name, corruption, atr_data, atr_corrupted):
  cfg, plus, minus = _pair(cfg_name, corruption, atr_data, atr_corrupted)
  assert minus.context.shape == plus.context.shape
  for field in SAME:
    np.testing.assert_array_equal(getattr(minus, field), getattr(plus, field), err_msg=field)
  np.testing.assert_array_equal(minus.changed_mask, minus.context != plus.context)
  assert not (minus.changed_mask & ~_allowed_span(cfg, corruption, plus)).any()
  if corruption in EVIDENCE_CORRUPTIONS:   # rows without evidence are left alone
    assert not minus.changed_mask[~plus.has_evidence].any()
    assert minus.changed_mask[plus.has_evidence].any(1).all()
  check_kinds_match_content(cfg, minus)


@pytest.mark.parametrize("corruption", ("value_swap", "evidence_swap", "removal"))
@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_evidence_corruptions_remove_the_answer(cfg_name, corruption, atr_data, atr_corrupted):
  """After the corruption no line of D− both names the query and carries y*."""
  cfg, plus, minus = _pair(cfg_name, corruption, atr_data, atr_corrupted)
  assert not minus.has_evidence.any()
  queries, lines = parsed(cfg, minus)
  answers = [cfg.vocab.decode(a) for a in plus.answer]
  for r in range(NUM):
    hits = [line for line in lines[r] if matches_query(cfg, queries[r], line)]
    if corruption == "value_swap" and plus.has_evidence[r]:
      assert len(hits) == 1 and _answer_of(cfg, hits[0]) != answers[r]
    else:
      assert not hits, (r, hits)
  if corruption == "value_swap":
    np.testing.assert_array_equal(minus.changed_mask, plus.value_mask)


def _answer_of(cfg, line) -> str:
  if cfg.variant == "value_for_key":
    return " ".join(f"v_{v}" for v in line["values"])
  return f"k_{line['key']}"


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_evidence_swap_gives_a_hard_negative(cfg_name, atr_data, atr_corrupted):
  cfg, plus, minus = _pair(cfg_name, "evidence_swap", atr_data, atr_corrupted)
  rows = plus.has_evidence
  ev_slot = (plus.line_kind == int(LineKind.EVIDENCE)).argmax(1)
  new_kind = minus.line_kind[np.arange(NUM), ev_slot]
  hard = (int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID))
  assert np.isin(new_kind[rows], hard).all()
  assert (minus.evidence_mask == plus.evidence_mask).all()
  assert (minus.hard_negative_mask[rows] >= plus.evidence_mask[rows]).all()


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_paraphrase_keeps_the_answer_in_another_format(cfg_name, atr_data, atr_corrupted):
  cfg, plus, minus = _pair(cfg_name, "paraphrase", atr_data, atr_corrupted)
  np.testing.assert_array_equal(minus.has_evidence, plus.has_evidence)
  _, lines_plus = parsed(cfg, plus)
  queries, lines_minus = parsed(cfg, minus)
  answers = [cfg.vocab.decode(a) for a in plus.answer]
  for r in np.nonzero(plus.has_evidence)[0]:
    hits = [(s, line) for s, line in enumerate(lines_minus[r])
            if matches_query(cfg, queries[r], line)]
    assert len(hits) == 1 and _answer_of(cfg, hits[0][1]) == answers[r]
    assert hits[0][1]["format"] != lines_plus[r][hits[0][0]]["format"]


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_distractor_injection_keeps_evidence_adds_hard_negatives(cfg_name, atr_data,
                                                                 atr_corrupted):
  cfg, plus, minus = _pair(cfg_name, "distractor_injection", atr_data, atr_corrupted)
  np.testing.assert_array_equal(minus.has_evidence, plus.has_evidence)
  assert not (minus.changed_mask & plus.evidence_mask).any()
  hard = np.isin(minus.line_kind, [int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID)])
  hard_plus = np.isin(plus.line_kind, [int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID)])
  assert (hard >= hard_plus).all() and hard.sum() > hard_plus.sum()
  changed_lines = np.zeros_like(hard)
  for r, slot in zip(*np.nonzero(minus.changed_mask & (minus.line_ids >= 0))):
    changed_lines[r, minus.line_ids[r, slot]] = True
  assert hard[changed_lines].all()
  # Each non-evidence, non-hard line of D+ turns hard w.p. δ (3σ).
  eligible = ~hard_plus & (plus.line_kind != int(LineKind.EVIDENCE))
  n, k = int(eligible.sum()), int((hard & eligible).sum())
  assert abs(k - n * cfg.delta) <= 3 * np.sqrt(n * cfg.delta * (1 - cfg.delta))


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_removal_puts_a_filler_passage_in_place_of_the_evidence(cfg_name, atr_data,
                                                                 atr_corrupted):
  """SPEC §3 'removal (the evidence passage → a filler passage of equal length)': every
  line of the former evidence passage is a filler line in D− (no evidence-format line,
  so no hard negative that a patch of E(D+) would leave behind); other passages stay."""
  from ceu_jax.data.types import LineKind  # pylint: disable=g-import-not-at-top
  cfg, plus, minus = _pair(cfg_name, "removal", atr_data, atr_corrupted)
  lines = np.asarray(plus.line_ids)
  for r in np.nonzero(plus.has_evidence)[0]:
    ev_line = int(lines[r][plus.evidence_mask[r]][0])
    passage = int(plus.passage_ids[r][plus.evidence_mask[r]][0])
    in_passage = sorted({int(l) for l in lines[r][plus.passage_ids[r] == passage] if l >= 0})
    assert ev_line in in_passage
    assert all(minus.line_kind[r][l] == LineKind.FILLER for l in in_passage), r
    others = [l for l in range(len(plus.line_kind[r])) if l not in in_passage]
    np.testing.assert_array_equal(minus.line_kind[r][others], plus.line_kind[r][others])
