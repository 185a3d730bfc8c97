"""Factual-QA batches and corruptions: conventions §1 fields, D+/D− alignment, knobs."""
from __future__ import annotations

import dataclasses
import sys
import tempfile

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from ceu_jax.data import factqa  # noqa: E402
from ceu_jax.data.factqa import builder, storage  # noqa: E402
from ceu_jax.data.types import LineKind, RetrievalBatch, kind_mask  # noqa: E402

CFG = factqa.FactQAConfig(num_passages=4, context_len=256, eta=0.2, delta=0.5)
B = 48


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
  """Build the tfds array_record cache in a fresh temp dir (once per module)."""
  mp = pytest.MonkeyPatch()
  mp.setenv(builder.CACHE_ENV, str(tmp_path_factory.mktemp("factqa_tfds")))
  yield
  mp.undo()


@pytest.fixture(scope="module")
def clean() -> RetrievalBatch:
  return factqa.generate_batch(CFG, seed=3, index=0, batch_size=B, split="eval")


def _np(batch: RetrievalBatch) -> dict[str, np.ndarray]:
  return {f: np.asarray(getattr(batch, f)) for f in batch.__dataclass_fields__}


def test_tfds_source_reads_without_tensorflow():
  rows = builder.load_split("test")
  manifest = storage.read_manifest()
  expected = sum(v for k, v in manifest["stats"]["splits"].items() if k.endswith("/test"))
  assert len(rows) == expected and rows[0]["passage"]
  assert "tensorflow" not in sys.modules


def test_batch_fields_follow_conventions(clean):
  b = _np(clean)
  n, lines = CFG.context_len, CFG.num_lines
  shapes = {"query": (B, CFG.query_len), "context": (B, n), "passage_ids": (B, n),
            "answer": (B, CFG.answer_len), "has_evidence": (B,), "evidence_mask": (B, n),
            "value_mask": (B, n), "distractor_mask": (B, n), "hard_negative_mask": (B, n),
            "passage_start": (B, n), "line_ids": (B, n), "line_kind": (B, lines),
            "changed_mask": (B, n), "example_id": (B,)}
  for field, shape in shapes.items():
    assert b[field].shape == shape, field
  for field in ("query", "context", "passage_ids", "answer", "line_ids", "line_kind",
                "example_id"):
    assert b[field].dtype == np.int32, field
  assert not b["changed_mask"].any()
  assert (b["value_mask"] <= b["evidence_mask"]).all()
  assert (b["context"][b["passage_start"]] == factqa.tokenizer.PSEP).all()
  assert (b["passage_start"].sum(1) == CFG.num_passages).all()
  assert (b["line_ids"][b["passage_start"]] == -1).all()
  assert (b["line_ids"][b["passage_ids"] < 0] == -1).all()
  assert (b["line_ids"].max(1) < CFG.num_lines).all()
  ev = kind_mask(clean, LineKind.EVIDENCE)
  np.testing.assert_array_equal(np.asarray(ev), b["evidence_mask"])
  np.testing.assert_array_equal(np.asarray(kind_mask(clean, LineKind.DISTRACTOR)),
                                b["distractor_mask"])
  hard = kind_mask(clean, LineKind.HARD_SAME_ID, LineKind.HARD_SAME_KEY)
  np.testing.assert_array_equal(np.asarray(hard), b["hard_negative_mask"])
  assert 0.5 < b["has_evidence"].mean() < 1.0
  assert (b["evidence_mask"].any(1) == b["has_evidence"]).all()


def test_value_tokens_are_the_answer(clean):
  b = _np(clean)
  for r in np.nonzero(b["has_evidence"])[0]:
    value = b["context"][r][b["value_mask"][r]]
    answer = b["answer"][r][b["answer"][r] != 0]
    np.testing.assert_array_equal(value, answer)


def test_stream_is_deterministic_and_ids_are_stable(clean):
  again = factqa.generate_batch(CFG, seed=3, index=0, batch_size=B, split="eval")
  for f, v in _np(clean).items():
    np.testing.assert_array_equal(v, np.asarray(getattr(again, f)), err_msg=f)
  ids = _np(clean)["example_id"]
  assert (ids // factqa.ID_STRIDE == factqa.SPLITS["eval"]).all()
  fd = factqa.load(CFG, "eval")
  other = factqa.example_batch(CFG, 0, [int(i) % factqa.ID_STRIDE for i in ids[:4]], "eval")
  np.testing.assert_array_equal(np.asarray(other.answer), _np(clean)["answer"][:4])
  assert fd.num_examples > 1000


@pytest.mark.parametrize("name", factqa.CORRUPTIONS)
def test_corruptions_are_token_aligned(clean, name):
  key = jax.random.PRNGKey(7)
  before = _np(clean)
  d = factqa.corrupt(CFG, clean, name, key)
  after = _np(d)
  for f in ("query", "answer", "passage_ids", "passage_start", "line_ids", "evidence_mask",
            "value_mask", "example_id"):
    np.testing.assert_array_equal(before[f], after[f], err_msg=f)
  changed = after["changed_mask"]
  np.testing.assert_array_equal(changed, before["context"] != after["context"])
  has = before["has_evidence"]
  if name == "distractor_injection":
    assert not (changed & before["evidence_mask"]).any()
    assert changed.any()
    np.testing.assert_array_equal(after["has_evidence"], has)
    return
  assert not (changed & ~before["evidence_mask"]).any()     # only the evidence line
  assert not changed[~has].any()                             # rows without evidence kept
  assert changed[has].any(1).mean() > 0.9
  if name == "paraphrase":
    np.testing.assert_array_equal(after["has_evidence"], has)
  else:
    assert not after["has_evidence"].any()
  again = _np(factqa.corrupt(CFG, clean, name, key))
  np.testing.assert_array_equal(again["context"], after["context"])  # pure
  np.testing.assert_array_equal(np.asarray(clean.context), before["context"])  # no mutation


def test_entity_swap_keeps_prefix_and_suffix_in_place(clean):
  fd = factqa.load(CFG, "eval")
  b = _np(clean)
  d = _np(factqa.corrupt(CFG, clean, "value_swap", 0))
  for r in np.nonzero(b["has_evidence"])[0]:
    item = fd.item(b["example_id"][r])
    start = np.nonzero(b["evidence_mask"][r])[0][0]
    slot = _slot(item)
    lo, hi = start + item.lines.value_start, start + item.lines.value_start + slot
    outside = b["evidence_mask"][r].copy()
    outside[lo:hi] = False
    np.testing.assert_array_equal(b["context"][r][outside], d["context"][r][outside])
    assert not np.array_equal(b["context"][r][lo:hi], d["context"][r][lo:hi])


def _slot(item) -> int:
  """Width of the mention slot: where plus and swap renderings differ, plus pads."""
  plus, swap = np.asarray(item.lines.plus), np.asarray(item.lines.swap)
  diff = np.nonzero(plus != swap)[0]
  return int(diff[-1]) + 1 - item.lines.value_start if diff.size else item.lines.value_len


def test_alignment_report_counts(clean):
  del clean
  fd = factqa.load(CFG, "eval")
  rep = fd.alignment_report()
  assert rep["examples"] == fd.num_examples
  swap = rep["entity_swap"]
  assert swap["equal_token_length"] + swap["padded"] == fd.num_examples
  assert len(swap["padded_ids"]) == swap["padded"]
  assert rep["unaligned"]["count"] == len(rep["unaligned"]["ids"])
  eq = factqa.load(dataclasses.replace(CFG, nq_swap="equal_length"), "eval")
  assert eq.alignment_report()["entity_swap"]["padded"] < swap["padded"]


def test_knobs_eta_delta():
  none = _np(factqa.generate_batch(dataclasses.replace(CFG, eta=1.0), 0, 0, 16, "eval"))
  assert not none["has_evidence"].any() and not none["evidence_mask"].any()
  nodis = _np(factqa.generate_batch(dataclasses.replace(CFG, eta=0.0, delta=0.0), 0, 0, 16,
                                    "eval"))
  assert nodis["has_evidence"].all()
  assert not nodis["distractor_mask"].any() and not nodis["hard_negative_mask"].any()
  alldis = _np(factqa.generate_batch(dataclasses.replace(CFG, delta=1.0), 0, 0, 16, "eval"))
  assert (alldis["distractor_mask"] | alldis["hard_negative_mask"]).any(1).mean() > 0.9


def test_counterfactual_slice_uses_invented_names():
  cfg = dataclasses.replace(CFG, counterfactual=True, eta=0.0)
  fd = factqa.load(cfg, "eval")
  b = _np(factqa.generate_batch(cfg, 0, 0, 16, "eval"))
  real = {it.answer_text for it in factqa.load(CFG, "eval").data.items}
  for r in range(16):
    item = fd.item(b["example_id"][r])
    assert item.answer_text not in real and item.answer_type in ("PERSON", "PLACE", "NAME")
    np.testing.assert_array_equal(b["context"][r][b["value_mask"][r]],
                                  b["answer"][r][b["answer"][r] != 0])
  d = _np(factqa.corrupt(cfg, factqa.generate_batch(cfg, 0, 0, 16, "eval"), "entity_swap", 1))
  assert d["changed_mask"].any(1).all()


@pytest.mark.parametrize("field,value,match", [
    ("eta", 1.5, r"data\.eta must be in \[0, 1\]"),
    ("delta", -0.1, r"data\.delta must be in \[0, 1\]"),
    ("num_passages", 0, r"data\.num_passages must be an integer \[1, 256\]"),
    ("context_len", 250, r"data\.context_len must be a multiple of data\.num_passages"),
    ("answer_len", 0, r"data\.answer_len must be an integer \[1, 64\]"),
    ("sources", ("wiki",), r"data\.sources must be a non-empty subset"),
    ("nq_swap", "x", r"data\.nq_swap must be one of"),
    ("counterfactual", "yes", r"data\.counterfactual must be a bool"),
])
def test_knob_validation(field, value, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(CFG, **{field: value})


def test_call_validation(clean):
  with pytest.raises(ValueError, match="corruption must be one of"):
    factqa.corrupt(CFG, clean, "shuffle", 0)
  with pytest.raises(ValueError, match=r"delta must be in \[0, 1\]"):
    factqa.corrupt(CFG, clean, "distractor_injection", 0, delta=2.0)
  with pytest.raises(ValueError, match="split must be one of"):
    factqa.generate_batch(CFG, 0, 0, 4, "dev")
  with pytest.raises(ValueError, match="batch_size"):
    factqa.generate_batch(CFG, 0, 0, 0, "eval")
  with pytest.raises(ValueError, match="unknown field"):
    factqa.FactQAConfig.from_config({"task": "factqa", "rho": 0.1})


def test_config_file():
  from configs import factqa as factqa_config  # pylint: disable=import-outside-toplevel
  for arg in ("tiny", "base", "tiny,sources=squad,counterfactual=true,delta=0.5"):
    c = factqa_config.get_config(arg)
    cfg = factqa.FactQAConfig.from_config(c.data)
    assert cfg.vocab.size == factqa.tokenizer.VOCAB_SIZE
    assert c.data.task == "factqa"
    for name in (c.cer.corruption, *c.eval.corruptions):
      factqa.corrupt(cfg, factqa.example_batch(cfg, 0, [factqa.load(cfg, "eval").usable[0]],
                                               "eval"), name, 0)


def test_a_first_build_leaves_no_temporary_directory(tmp_path, monkeypatch):
  """tfds' bucket lookup (skipped: tfds_local) left an empty tmp*tfds directory behind."""
  system_tmp = tmp_path / "system_tmp"
  system_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
  assert builder.load_split("test", cache_dir=tmp_path / "cache")
  assert list(system_tmp.iterdir()) == []
