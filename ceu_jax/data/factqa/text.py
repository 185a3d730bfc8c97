"""Deterministic text processing for factual QA: sentences, answer types, the evidence matcher.

Everything here is pure Python on strings (no randomness, no model), so the
preparation script and the tests reproduce the same evidence spans everywhere.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional

# Tokens before a period that do not end a sentence.
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "no", "inc", "co", "ltd", "mt",
    "ft", "gen", "col", "lt", "sgt", "capt", "prof", "rev", "gov", "sen", "rep", "u.s",
    "e.g", "i.e", "etc", "approx", "dept", "univ", "est", "jan", "feb", "mar", "apr",
    "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "fig", "al", "op", "ca",
})
_SENT_END = re.compile(r"[.!?]['\")\]]*(?=\s+(?!'')[\"'(\[`A-Z0-9])")
_TABLE_GAP = re.compile(r"\s{3,}")
_CLAUSE_HARD = re.compile(r"\s*(?:;|:\s|\s[–—]\s|\s-\s-\s)\s*")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")

STOPWORDS = frozenset("""
a an the of in on at to for from by with as and or but is are was were be been being
do does did done has have had having what which who whom whose when where why how
that this these those it its it's their there they them he she his her him i you we
our your me my not no than then so such can could would should will shall may might
must into onto over under about after before during since until upon within without
also other another any some many much more most one first name named called year
""".split())

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")
_MONTH_RE = re.compile(r"\b(" + "|".join(m.capitalize() for m in MONTHS) + r")\b")
_YEAR_RE = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})s?\b")
_NUMBER_RE = re.compile(
    r"^(about |approximately |over |nearly |around |almost |more than |less than )?"
    r"[$£€]?[0-9][0-9,.]*(\s?(%|percent|million|billion|thousand|hundred|[a-zA-Z]{1,12}))?$")
_NUMBER_WORDS = frozenset("""zero one two three four five six seven eight nine ten eleven
twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty
fifty sixty seventy eighty ninety hundred thousand million billion""".split())

ANSWER_TYPES = ("PERSON", "PLACE", "DATE", "NUMBER", "NAME")
NAMEABLE_TYPES = ("PERSON", "PLACE", "NAME")
_PLACE_WORDS = ("city", "country", "state", "river", "county", "town", "region",
                "island", "continent", "province", "mountain", "ocean", "sea",
                "nation", "capital", "location", "place", "lake", "village")
_PERSON_WORDS = ("person", "people", "man", "woman", "player", "actor", "actress", "singer",
                 "president", "king", "queen", "emperor", "scientist", "author", "writer",
                 "composer", "artist", "leader", "coach", "quarterback", "poet", "general",
                 "philosopher", "physicist", "inventor", "pope", "minister", "explorer")
_HOW_NUMERIC = ("how many", "how much", "how long", "how old", "how far", "how tall",
                "how big", "how large", "how high", "how often", "how deep", "how fast",
                "what percentage", "what percent", "what number", "what amount")
_DATE_Q = ("when", "what year", "in what year", "in which year", "which year",
           "what date", "on what date", "what day", "what century", "what decade",
           "in what decade", "what month", "in what month")


@dataclasses.dataclass(frozen=True)
class Span:
  """A character span [start, end) of a text."""
  start: int
  end: int


def split_sentences(text: str) -> list[Span]:
  """Sentence spans of `text` (regex splitter with an abbreviation list; tables split on gaps)."""
  spans: list[Span] = []
  for block in _blocks(text):
    start = block.start
    for m in _SENT_END.finditer(text, block.start, block.end):
      if _is_abbreviation(text, m.start()):
        continue
      spans.append(Span(start, m.end()))
      start = _skip_space(text, m.end(), block.end)
    if start < block.end:
      spans.append(Span(start, block.end))
  return [s for s in (_strip(text, s) for s in spans) if s.end > s.start]


def _blocks(text: str) -> list[Span]:
  """Spans between runs of 3+ whitespace characters (NQ tables and lists) and newlines."""
  out, start = [], 0
  for m in re.finditer(r"\s{3,}|\n+", text):
    out.append(Span(start, m.start()))
    start = m.end()
  out.append(Span(start, len(text)))
  return [b for b in out if b.end > b.start]


def _is_abbreviation(text: str, dot: int) -> bool:
  if text[dot] != ".":
    return False
  m = re.search(r"([A-Za-z.]+)$", text[max(0, dot - 12):dot])
  if not m:
    return False
  word = m.group(1).lower().strip(".")
  return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _skip_space(text: str, i: int, end: int) -> int:
  while i < end and text[i].isspace():
    i += 1
  return i


def _strip(text: str, s: Span) -> Span:
  start, end = s.start, s.end
  while start < end and text[start].isspace():
    start += 1
  while end > start and text[end - 1].isspace():
    end -= 1
  return Span(start, end)


def content_words(text: str) -> list[str]:
  """Lower-cased non-stopword words of `text`, in order."""
  return [w.lower() for w in _WORD.findall(text) if w.lower() not in STOPWORDS]


def query_entity_words(question: str) -> set[str]:
  """Words naming the query entity: capitalised words after the first, else all content words."""
  words = _WORD.findall(question)
  caps = {w.lower() for w in words[1:] if w[:1].isupper() and w.lower() not in STOPWORDS}
  return caps or set(content_words(question))


def find_mentions(text: str, answer: str) -> list[Span]:
  """Word-bounded occurrences of `answer` in `text` (case-sensitive)."""
  if not answer:
    return []
  pattern = r"(?<![A-Za-z0-9])" + re.escape(answer) + r"(?![A-Za-z0-9])"
  return [Span(m.start(), m.end()) for m in re.finditer(pattern, text)]


def is_capitalised(answer: str) -> bool:
  """True if every long word starts upper-case (a proper name)."""
  words = _WORD.findall(answer)
  if not words:
    return False
  long_words = [w for w in words if w.lower() not in STOPWORDS]
  return (any(w[:1].isupper() for w in long_words)
          and all(w[:1].isupper() or w[:1].isdigit() for w in long_words))


def answer_type(question: str, answer: str) -> str:
  """One of ANSWER_TYPES, or 'OTHER' (common-noun / descriptive answers)."""
  q = " ".join(question.lower().split())
  a = answer.strip()
  if _is_numberish(a):
    if _YEAR_RE.fullmatch(a) or any(q.startswith(p) for p in _DATE_Q):
      return "DATE"
    return "NUMBER"
  if _is_dateish(a) or re.fullmatch(r"(the\s+)?(early\s+|late\s+|mid-?\s*)?[0-9]{1,2}(st|nd|rd|th)"
                                    r"(\s+|-)century(\s+(AD|BC|BCE|CE))?", a, re.I):
    return "DATE"
  if not is_capitalised(a):
    return "OTHER"
  if re.search(r"\b(who|whom|whose)\b", q) or re.search(
      r"\b(what|which)\s+(\w+\s+){0,2}(" + "|".join(_PERSON_WORDS) + r")\b", q):
    return "PERSON"
  if q.startswith("where") or re.search(
      r"\b(what|which|in what|in which)\s+(" + "|".join(_PLACE_WORDS) + r")\b", q):
    return "PLACE"
  return "NAME"


def _is_numberish(a: str) -> bool:
  words = a.lower().split()
  return bool(_NUMBER_RE.match(a)) or (0 < len(words) <= 3 and words[0] in _NUMBER_WORDS)


def _is_dateish(a: str) -> bool:
  if not (_MONTH_RE.search(a) or _YEAR_RE.search(a)):
    return False
  rest = _WORD.findall(_YEAR_RE.sub(" ", _MONTH_RE.sub(" ", a)))
  return all(w.isdigit() or w.lower() in ("th", "st", "nd", "rd", "the", "of", "early",
                                          "late", "mid", "in", "on", "ad", "bc", "to",
                                          "and", "from", "between", "until", "c", "circa")
             for w in rest)


def question_kind(question: str) -> Optional[str]:
  """None for a single-hop factoid question; else the reason it is not one."""
  q = " ".join(question.lower().split())
  if q.startswith("why") or re.search(r"\bwhy\b", q):
    return "non_factoid_question"
  if re.match(r"^(how|in what way|in what ways)\b", q) and not any(
      q.startswith(p) for p in _HOW_NUMERIC):
    return "non_factoid_question"
  if re.search(r"\b(and|or) (who|what|when|where|which)\b", q):
    return "multi_part_question"
  return None


_GENERIC_HEADS = frozenset(("is", "was", "are", "were", "did", "does", "do", "has", "had",
                            "have", "can", "could", "will", "would", "type", "kind", "name",
                            "sort", "the", "a", "an", "other", "two", "one", "famous",
                            "new", "first", "last", "specific", "particular"))


def answer_subtype(question: str) -> str:
  """The head noun of a 'what/which X' question ('war', 'airport'), singular; else ''."""
  m = re.match(r"^(?:(?:in|on|at|from|to|by|for|of|during|with)\s+)?(?:what|which)\s+([a-z]+)",
               " ".join(question.lower().split()))
  if not m or m.group(1) in _GENERIC_HEADS:
    return ""
  word = m.group(1)
  if word.endswith("ies"):
    return word[:-3] + "y"
  return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def relation_key(question: str, atype: str) -> str:
  """A coarse relation id: the first two words of the question and the answer type."""
  words = [w.lower() for w in _WORD.findall(question)][:2]
  return " ".join(words) + "|" + atype


@dataclasses.dataclass(frozen=True)
class Evidence:
  """The located evidence: sentence index, clause span and answer span in the passage."""
  sentence_index: int
  clause: Span
  answer: Span
  entity_overlap: int


def locate_evidence(passage: str, sentences: list[Span], question: str, answer: str,
                    max_words: int = 40) -> Optional[Evidence]:
  """The matcher: the sentence holding `answer` with most query overlap, trimmed to a clause.

  Candidates are word-bounded answer mentions; each is scored by the overlap of its
  sentence with the query-entity words, then with all question content words; ties go
  to the earliest mention. The sentence is cut at hard clause separators (; : dashes)
  and, if still longer than `max_words`, at commas around the mention.
  """
  entity = query_entity_words(question)
  qwords = set(content_words(question))
  best, best_key = None, None
  for mention in find_mentions(passage, answer):
    idx = _sentence_of(sentences, mention)
    if idx is None:
      continue
    words = set(content_words(passage[sentences[idx].start:sentences[idx].end]))
    key = (len(words & entity), len(words & qwords), -mention.start)
    if best_key is None or key > best_key:
      best, best_key = (idx, mention), key
  if best is None:
    return None
  idx, mention = best
  clause = trim_clause(passage, sentences[idx], mention, qwords, max_words)
  return Evidence(idx, clause, mention, best_key[0])


def _sentence_of(sentences: list[Span], mention: Span) -> Optional[int]:
  for i, s in enumerate(sentences):
    if s.start <= mention.start and mention.end <= s.end:
      return i
  return None


def trim_clause(text: str, sentence: Span, mention: Span, qwords: set[str],
                max_words: int) -> Span:
  """The clause of `sentence` around `mention` (see `locate_evidence`)."""
  pieces = _cut(text, sentence, _CLAUSE_HARD)
  piece = _cover(pieces, mention) or sentence
  if len(text[piece.start:piece.end].split()) <= max_words:
    return _strip_punct(text, piece, mention)
  commas = _cut(text, piece, re.compile(r",\s"))
  i = next((k for k, p in enumerate(commas) if p.start <= mention.start < p.end), None)
  j = next((k for k, p in enumerate(commas) if p.start < mention.end <= p.end), None)
  if i is None or j is None:
    return _strip_punct(text, piece, mention)
  lo, hi = i, j
  while True:
    options = []
    for nlo, nhi in ((lo - 1, hi), (lo, hi + 1)):
      if nlo < 0 or nhi >= len(commas):
        continue
      span = Span(commas[nlo].start, commas[nhi].end)
      if len(text[span.start:span.end].split()) > max_words:
        continue
      gain = len(set(content_words(text[commas[min(nlo, lo)].start:commas[max(nhi, hi)].end]))
                 & qwords)
      options.append((gain, -nlo if nlo < lo else nhi, nlo, nhi))
    if not options:
      break
    _, _, lo, hi = max(options)
  return _strip_punct(text, Span(commas[lo].start, commas[hi].end), mention)


def _cover(pieces: list[Span], mention: Span) -> Optional[Span]:
  """The union of the pieces overlapping `mention` (None if none does)."""
  hit = [p for p in pieces if p.start < mention.end and mention.start < p.end]
  if not hit:
    return None
  return Span(min(hit[0].start, mention.start), max(hit[-1].end, mention.end))


def _cut(text: str, span: Span, sep: re.Pattern) -> list[Span]:
  out, start = [], span.start
  for m in sep.finditer(text, span.start, span.end):
    out.append(Span(start, m.start()))
    start = m.end()
  out.append(Span(start, span.end))
  return [_strip(text, p) for p in out if p.end > p.start] or [span]


def _strip_punct(text: str, span: Span, mention: Span) -> Span:
  """Strip separators at the clause edges, never cutting into the mention."""
  start, end = span.start, span.end
  while start < mention.start and text[start] in " ,;:-–—":
    start += 1
  while end > mention.end and text[end - 1] in " ,;:-–—":
    end -= 1
  return Span(start, end)
