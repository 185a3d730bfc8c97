"""Factual-QA preparation: shipped files, the evidence matcher, the writer, regeneration.

Only the tokenizer test needs `tokenizers`; the rest runs on a bare `.[test]` install.
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from ceu_jax.data.factqa import prepare, rewrite, storage, text, tokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = storage.SHIPPED_DIR
SAMPLE = SHIPPED / "sample_raw.json.gz"
# Fields of a record that depend on the record alone (not on the corpus or tokenizer).
LOCAL_FIELDS = ("source", "split", "question", "answer", "answer_type", "relation",
                "passage_id", "sentence_index", "evidence", "answer_char", "evidence_start",
                "evidence_end", "answer_start", "entity_overlap", "paraphrase",
                "paraphrase_rule", "annotated_start", "swap_source")


@pytest.fixture(scope="module")
def examples():
  return storage.read_examples()


@pytest.fixture(scope="module")
def passages():
  return storage.read_passages()


def test_manifest_sizes_and_counts(examples, passages):
  manifest = storage.verify()
  total = sum(p.stat().st_size for p in SHIPPED.iterdir())
  assert total <= 15 * 2**20, total
  stats = manifest["stats"]
  for source in ("squad", "nq"):
    kept = sum(1 for r in examples if r["source"] == source)
    assert stats["sources"][source]["kept"] == kept > 1000
  assert sum(stats["splits"].values()) == len(examples)
  assert [r["id"] for r in examples] == sorted(r["id"] for r in examples)
  assert {r["passage_id"] for r in examples} <= set(passages)
  assert manifest["sha256"][prepare_script().SAMPLE_FILE] == storage.sha256_file(SAMPLE)
  assert (SHIPPED / "LICENSE").is_file()


def prepare_script():
  sys.path.insert(0, str(REPO / "scripts"))
  import prepare_factqa  # pylint: disable=import-outside-toplevel
  return prepare_factqa


def test_squad_evidence_contains_annotated_answer(examples):
  squad = [r for r in examples if r["source"] == "squad"]
  ok = sum(1 for r in squad if r["evidence_start"] <= r["annotated_start"]
           and r["annotated_start"] + len(r["answer"]) <= r["evidence_end"])
  assert ok / len(squad) >= 0.99, (ok, len(squad))


def test_evidence_is_a_clause_of_its_sentence(examples, passages):
  for r in examples:
    sentence = passages[r["passage_id"]]["sentences"][r["sentence_index"]]
    assert r["evidence"] in sentence, r["id"]
    c = r["answer_char"]
    assert r["evidence"][c:c + len(r["answer"])] == r["answer"], r["id"]
    assert len(text.find_mentions(r["evidence"], r["answer"])) == 1, r["id"]
    assert r["answer"] in r["paraphrase"], r["id"]
    assert r["swap"] and r["swap"].lower() != r["answer"].lower(), r["id"]
    assert r["answer_type"] in text.ANSWER_TYPES
    assert (r["cf_answer"] is not None) == (r["answer_type"] in text.NAMEABLE_TYPES)


def test_nq_passages_are_restored(examples, passages):
  nq = [r for r in examples if r["source"] == "nq"][:500]
  for r in nq:
    body = " ".join(passages[r["passage_id"]]["sentences"])
    assert r["answer"] in body and r["swap"] not in body, r["id"]
    assert r["swap_source"] == "dataset"


def _sample_records():
  raw = json.loads(gzip.decompress(SAMPLE.read_bytes()))
  counts = prepare.Counts()
  sq, sq_p = prepare.process_squad(raw["squad"], counts)
  nq, nq_p = prepare.process_nq(raw["nq"], counts)
  return sq + nq, sq_p + nq_p, counts


def test_matcher_on_shipped_sample_reproduces_shipped_records(examples, passages):
  records, sample_passages, counts = _sample_records()
  assert counts.kept["squad"] > 10 and counts.kept["nq"] > 50
  assert sum(sum(d.values()) for d in counts.dropped.values()) > 0
  shipped = {r["id"]: r for r in examples}
  for rec in records:
    assert rec["id"] in shipped, rec["id"]
    for field in LOCAL_FIELDS:
      assert rec.get(field) == shipped[rec["id"]].get(field), (rec["id"], field)
  for p in sample_passages:
    assert p == passages[p["id"]]


def test_writer_is_deterministic(tmp_path):
  records, _, _ = _sample_records()
  a = storage.write_jsonl_gz(tmp_path / "a.jsonl.gz", records)
  b = storage.write_jsonl_gz(tmp_path / "b.jsonl.gz", list(records))
  assert a == b
  data = (tmp_path / "a.jsonl.gz").read_bytes()
  assert data[4:8] == b"\0\0\0\0"   # gzip mtime field is zero
  assert list(storage.iter_jsonl_gz(tmp_path / "a.jsonl.gz")) == records


def test_tokenizer_training_is_deterministic():
  pytest.importorskip("tokenizers")
  records, passages, _ = _sample_records()
  lines = list(prepare.corpus_lines(records, passages))
  a = tokenizer.train(lines, vocab_size=400).to_str()
  b = tokenizer.train(lines, vocab_size=400).to_str()
  assert a == b
  tok = tokenizer.FactTokenizer(a)
  assert tok.encode("[PAD]") == [tokenizer.PAD]
  shipped = tokenizer.shipped_tokenizer()
  assert shipped.size == tokenizer.VOCAB_SIZE


def test_matcher_units():
  passage = ("Paris is the capital of France. The Seine flows through Paris; "
             "it is 777 km long. Dr. Smith lives in Lyon.")
  spans = text.split_sentences(passage)
  assert [passage[s.start:s.end] for s in spans] == [
      "Paris is the capital of France.",
      "The Seine flows through Paris; it is 777 km long.", "Dr. Smith lives in Lyon."]
  ev = text.locate_evidence(passage, spans, "How long is the Seine?", "777 km")
  assert ev is not None and ev.sentence_index == 1
  assert passage[ev.clause.start:ev.clause.end] == "it is 777 km long."
  assert text.answer_type("Who wrote Hamlet?", "William Shakespeare") == "PERSON"
  assert text.answer_type("When did it open?", "1990") == "DATE"
  assert text.answer_type("How many moons?", "two") == "NUMBER"
  assert text.answer_type("What is it made of?", "wood") == "OTHER"
  assert text.question_kind("Why did it fail?") == "non_factoid_question"


def test_paraphrase_and_names_are_deterministic():
  assert rewrite.paraphrase("In 1990, the company hired ", "John", " .") == (
      "The company hired John in 1990 .", "front")
  assert rewrite.paraphrase("", "Ann Lee", " as the Queen") == (
      "the Queen is played by Ann Lee", "cast")
  assert rewrite.invented_name("k", "PERSON", 2) == rewrite.invented_name("k", "PERSON", 2)
  assert len(rewrite.invented_name("k", "PLACE", 3).split()) == 3


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage"])
def test_damaged_files_raise_clear_error(tmp_path, damage):
  root = tmp_path / "shipped"
  shutil.copytree(SHIPPED, root)
  path = root / storage.EXAMPLES_FILE
  if damage == "missing":
    path.unlink()
  elif damage == "truncated":
    path.write_bytes(path.read_bytes()[:1000])
  else:
    path.write_bytes(b"not gzip")
  with pytest.raises(storage.FactQADataError, match="python scripts/prepare_factqa.py"):
    storage.verify(root)
  with pytest.raises(storage.FactQADataError, match="python scripts/prepare_factqa.py"):
    storage.read_examples(root)
  from ceu_jax.data.factqa import builder  # pylint: disable=import-outside-toplevel
  with pytest.raises(storage.FactQADataError, match="python scripts/prepare_factqa.py"):
    builder.get_builder(root, cache_dir=tmp_path / "cache")


def test_missing_manifest_raises_clear_error(tmp_path):
  root = tmp_path / "shipped"
  shutil.copytree(SHIPPED, root)
  (root / storage.MANIFEST_FILE).unlink()
  with pytest.raises(storage.FactQADataError, match="prepare_factqa"):
    storage.verify(root)


@pytest.mark.slow
def test_preparation_regenerates_shipped_bytes(tmp_path):
  """Re-runs the full preparation (downloads the bigbench sdist unless cached in
  $CEU_FACTQA_WORK_DIR / /tmp/ceu_factqa_work) and compares every generated file."""
  work = os.environ.get("CEU_FACTQA_WORK_DIR", "/tmp/ceu_factqa_work")
  out = tmp_path / "out"
  subprocess.run([sys.executable, str(REPO / "scripts" / "prepare_factqa.py"),
                  "--work-dir", work, "--out", str(out)], check=True, cwd=REPO)
  names = sorted(p.name for p in out.iterdir())
  assert names == sorted([*storage.DATA_FILES, storage.MANIFEST_FILE,
                          prepare_script().SAMPLE_FILE])
  for name in names:
    assert (out / name).read_bytes() == (SHIPPED / name).read_bytes(), name
