"""Raw SQuAD / NQ-conflict items -> prepared factual-QA records (text level).

Stage 1 (`process_squad`, `process_nq`) is a per-item pure function of the raw
files; stage 2 (`add_substitutes`) needs the trained tokenizer to pick
equal-token-length substitutes. `scripts/prepare_factqa.py` drives both.
"""
from __future__ import annotations

import collections
import hashlib
import re
from typing import Any, Callable, Iterable, Optional

from ceu_jax.data.factqa import rewrite, text

MAX_ANSWER_WORDS = 5
MAX_QUESTION_WORDS = 30
MAX_CLAUSE_WORDS = 40
MIN_CLAUSE_WORDS = 4
Record = dict[str, Any]


class Counts:
  """Kept / dropped-by-reason counters per source."""

  def __init__(self):
    self.kept: collections.Counter = collections.Counter()
    self.dropped: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

  def drop(self, source: str, reason: str) -> None:
    self.dropped[source][reason] += 1

  def as_dict(self) -> dict[str, Any]:
    return {s: {"kept": self.kept[s], "dropped": dict(sorted(self.dropped[s].items()))}
            for s in sorted(set(self.kept) | set(self.dropped))}


def split_of(key: str, train_tenths: int = 8) -> str:
  """train / validation / test by a hash of `key` (NQ: the question, 80/10/10; SQuAD:
  the article title, 60/20/20, since its 48 articles are the unit)."""
  bucket = int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 10
  rest = (10 - train_tenths) // 2
  if bucket < train_tenths:
    return "train"
  return "validation" if bucket < train_tenths + rest else "test"


def _check_question(question: str, answer: str) -> Optional[str]:
  reason = text.question_kind(question)
  if reason:
    return reason
  if len(question.split()) > MAX_QUESTION_WORDS:
    return "question_too_long"
  if not answer.strip() or len(answer.split()) > MAX_ANSWER_WORDS:
    return "answer_too_long"
  if text.answer_type(question, answer) == "OTHER":
    return "answer_not_entity"
  return None


def build_record(source: str, ex_id: str, split: str, question: str, answer: str,
                 passage_id: str, passage: str,
                 sentences: list[text.Span]) -> tuple[Optional[Record], str]:
  """One prepared record, or (None, drop reason)."""
  reason = _check_question(question, answer)
  if reason:
    return None, reason
  holders = {i for i, s in enumerate(sentences) for m in text.find_mentions(passage, answer)
             if s.start <= m.start < s.end}
  if len(holders) > 1:
    return None, "answer_in_several_sentences"
  ev = text.locate_evidence(passage, sentences, question, answer, MAX_CLAUSE_WORDS)
  if ev is None:
    return None, "answer_not_in_a_sentence"
  clause = passage[ev.clause.start:ev.clause.end]
  n_words = len(clause.split())
  if n_words > MAX_CLAUSE_WORDS:
    return None, "evidence_too_long"
  if n_words < MIN_CLAUSE_WORDS:
    return None, "evidence_too_short"
  if len(text.find_mentions(clause, answer)) != 1:
    return None, "answer_repeated_in_evidence"
  answer_char = ev.answer.start - ev.clause.start
  atype = text.answer_type(question, answer)
  para, rule = rewrite.paraphrase(clause[:answer_char], answer,
                                  clause[answer_char + len(answer):])
  return {
      "id": ex_id, "source": source, "split": split, "question": " ".join(question.split()),
      "answer": answer, "answer_type": atype, "relation": text.relation_key(question, atype),
      "passage_id": passage_id, "sentence_index": ev.sentence_index, "evidence": clause,
      "answer_char": answer_char, "evidence_start": ev.clause.start,
      "evidence_end": ev.clause.end, "answer_start": ev.answer.start,
      "entity_overlap": ev.entity_overlap, "paraphrase": para, "paraphrase_rule": rule,
  }, ""


def passage_record(pid: str, source: str, title: str, passage: str,
                   sentences: list[text.Span]) -> Record:
  return {"id": pid, "source": source, "title": title,
          "sentences": [passage[s.start:s.end] for s in sentences]}


def process_squad(data: dict[str, Any], counts: Counts) -> tuple[list[Record], list[Record]]:
  """SQuAD v1.1 dev JSON -> (examples, passages)."""
  examples, passages = [], []
  for article in data["data"]:
    title = article["title"]
    for p_idx, para in enumerate(article["paragraphs"]):
      passage = para["context"]
      sentences = text.split_sentences(passage)
      pid = f"squad:{title}:{p_idx:03d}"
      kept_here = 0
      for qa in para["qas"]:
        gold = qa["answers"][0]
        rec, reason = build_record("squad", f"squad:{qa['id']}", split_of(title, 6),
                                   qa["question"], gold["text"].strip(), pid, passage,
                                   sentences)
        if rec is None:
          counts.drop("squad", reason)
          continue
        rec["annotated_start"] = gold["answer_start"] + (
            len(gold["text"]) - len(gold["text"].lstrip()))
        rec["swap_source"] = "same_type_pool"
        examples.append(rec)
        counts.kept["squad"] += 1
        kept_here += 1
      if kept_here:
        passages.append(passage_record(pid, "squad", title, passage, sentences))
  return examples, passages


_NQ_INPUT = re.compile(r"^\s*Question:\s*(.*?)\s*\nContext:\s*(.*)$", re.S)


def restore_nq(item: dict[str, Any]) -> tuple[Optional[tuple[str, str, str, str]], str]:
  """(question, original passage, original answer, swapped entity), or (None, reason)."""
  m = _NQ_INPUT.match(item["input"])
  scores = item.get("target_scores", {})
  originals = [k for k, v in scores.items() if v == 0]
  swapped = [k for k, v in scores.items() if v == 1]
  if not m or len(originals) != 1 or len(swapped) != 1:
    return None, "malformed_item"
  question, ctx = m.group(1), m.group(2)
  original, swap = originals[0].strip(), swapped[0].strip()
  mentions = text.find_mentions(ctx, swap)
  if len(mentions) != 1:
    return None, "swap_mentioned_not_once"
  s = mentions[0]
  restored = ctx[:s.start] + original + ctx[s.end:]
  if text.find_mentions(restored, swap):
    return None, "swap_mentioned_not_once"
  return (question, restored, original, swap), ""


def process_nq(task: dict[str, Any], counts: Counts) -> tuple[list[Record], list[Record]]:
  """bigbench contextual_parametric_knowledge_conflicts task -> (examples, passages)."""
  examples, passages, seen = [], [], set()
  for i, item in enumerate(task["examples"]):
    restored, reason = restore_nq(item)
    if restored is None:
      counts.drop("nq", reason)
      continue
    question, passage, original, swap = restored
    key = " ".join(question.lower().split())
    if key in seen:
      counts.drop("nq", "duplicate_question")
      continue
    seen.add(key)
    sentences = text.split_sentences(passage)
    pid = f"nq:{i:05d}"
    rec, reason = build_record("nq", pid, split_of(key), question, original, pid, passage,
                               sentences)
    if rec is None:
      counts.drop("nq", reason)
      continue
    rec.update(swap=swap, swap_source="dataset", annotated_start=None)
    examples.append(rec)
    passages.append(passage_record(pid, "nq", "", passage, sentences))
    counts.kept["nq"] += 1
  return examples, passages


def corpus_lines(examples: list[Record], passages: list[Record]) -> Iterable[str]:
  """The text the tokenizer is trained on (sorted, deterministic)."""
  for p in sorted(passages, key=lambda r: r["id"]):
    yield from p["sentences"]
  for e in sorted(examples, key=lambda r: r["id"]):
    yield e["question"]
    yield e["paraphrase"]


def add_substitutes(examples: list[Record], passages: dict[str, Record],
                    n_tokens: Callable[[str], int]) -> None:
  """Fill `swap` (SQuAD: a same-type answer from another article, equal token length
  where possible), `swap_equal` (NQ: another item's swapped entity of equal token
  length) and, for nameable types, invented `cf_answer` / `cf_swap`."""
  pools = _swap_pools(examples, n_tokens)
  nq_flat = collections.defaultdict(set)
  for r in examples:
    if r["source"] == "nq":
      nq_flat[r["answer_type"]].add((n_tokens(r["swap"]), r["swap"], r["passage_id"]))
  nq_pools = {k: _by_length(v) for k, v in nq_flat.items()}
  for rec in examples:
    body = " ".join(passages[rec["passage_id"]]["sentences"])
    if rec["source"] == "squad":
      sub = pools.get((rec["answer_type"], text.answer_subtype(rec["question"])), {})
      rec["swap"] = (_pick_swap(rec, body, sub, n_tokens, max_gap=1)
                     or _pick_swap(rec, body, pools.get(rec["answer_type"], {}), n_tokens))
    else:
      rec["swap_equal"] = _pick_swap(rec, body, nq_pools[rec["answer_type"]], n_tokens)
    rec["cf_answer"], rec["cf_swap"] = _invented_pair(rec, n_tokens)


def _swap_pools(examples: list[Record], n_tokens: Callable[[str], int]) -> dict[Any, dict]:
  """SQuAD answers by type (and by (type, question head noun)), then by token count:
  {type: {n_tokens: [(answer, title)]}}."""
  flat = collections.defaultdict(set)
  for rec in examples:
    if rec["source"] == "squad":
      title = rec["passage_id"].rsplit(":", 1)[0]
      entry = (n_tokens(rec["answer"]), rec["answer"], title)
      flat[rec["answer_type"]].add(entry)
      sub = text.answer_subtype(rec["question"])
      if sub:
        flat[(rec["answer_type"], sub)].add(entry)
  return {k: _by_length(v) for k, v in flat.items()}


def _by_length(entries: Iterable[tuple[int, str, str]]) -> dict[int, list[tuple[str, str]]]:
  out: dict[int, list] = collections.defaultdict(list)
  for n, text_, title in sorted(entries):
    out[n].append((text_, title))
  return dict(out)


def _pick_swap(rec: Record, body: str, pool: dict[int, list[tuple[str, str]]],
               n_tokens: Callable[[str], int], max_gap: int = 64) -> str:
  """A substitute of the nearest token count (shorter first on ties, at most `max_gap`
  away): from a hashed start, the first entry of another article that differs from
  the answer and does not occur in the passage ('' if none)."""
  want = n_tokens(rec["answer"])
  title = rec["passage_id"].rsplit(":", 1)[0]
  ans = rec["answer"].lower()
  start = _hash_int(rec["id"] + "/swap")
  for gap in range(0, max_gap + 1):
    for n in sorted({want - gap, want + gap}):
      bucket = pool.get(n, [])
      for k in range(len(bucket)):
        cand, cand_title = bucket[(start + k) % len(bucket)]
        if (cand_title != title and cand.lower() != ans and ans not in cand.lower()
            and cand.lower() not in ans and cand not in body):
          return cand
  return ""


def _invented_pair(rec: Record, n_tokens: Callable[[str], int]) -> tuple[Optional[str],
                                                                        Optional[str]]:
  """(cf_answer, cf_swap): invented names with the answer's word count and, where one
  of 64 candidates allows, its token count (so the slice keeps the factual lengths)."""
  if rec["answer_type"] not in text.NAMEABLE_TYPES:
    return None, None
  n_words = len(rec["answer"].split())
  want = n_tokens(rec["answer"])
  cf = _closest_name(f"{rec['id']}/cf", rec["answer_type"], n_words, want, n_tokens, ())
  swap = _closest_name(f"{rec['id']}/cf_swap", rec["answer_type"], n_words, want,
                       n_tokens, (cf,))
  return cf, swap


def _closest_name(key: str, atype: str, n_words: int, want: int,
                  n_tokens: Callable[[str], int], avoid: tuple[str, ...]) -> str:
  best = None
  for k in range(64):
    cand = rewrite.invented_name(f"{key}/{k}", atype, n_words)
    if cand in avoid:
      continue
    gap = abs(n_tokens(cand) - want)
    if best is None or gap < best[0]:
      best = (gap, cand)
    if gap == 0:
      break
  return best[1]


def _hash_int(key: str) -> int:
  return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:12], 16)
