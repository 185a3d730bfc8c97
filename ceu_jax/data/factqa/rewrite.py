"""Deterministic rewrites of an evidence clause: paraphrase and invented entity names.

Both are pure functions of their inputs (names draw from a hash of a string key),
so the preparation script writes the same text on every run.
"""
from __future__ import annotations

import hashlib
import re

# Word substitutions that keep the meaning of a factual clause (both directions where safe).
_SYNONYMS: tuple[tuple[str, str], ...] = (
    ("began", "started"), ("started", "began"), ("begins", "starts"), ("starts", "begins"),
    ("large", "big"), ("big", "large"), ("largest", "biggest"), ("biggest", "largest"),
    ("many", "numerous"), ("approximately", "roughly"), ("about", "around"),
    ("located", "situated"), ("situated", "located"), ("built", "constructed"),
    ("constructed", "built"), ("died", "passed away"), ("famous", "well-known"),
    ("main", "principal"), ("received", "got"), ("created", "made"), ("used", "employed"),
    ("uses", "employs"), ("includes", "comprises"), ("include", "comprise"),
    ("several", "a number of"), ("because", "since"), ("however", "nevertheless"),
    ("However", "Nevertheless"), ("also", "additionally"), ("known as", "called"),
    ("called", "named"), ("named", "called"), ("founded", "established"),
    ("established", "founded"), ("produced", "made"), ("released", "issued"),
    ("played", "performed"), ("portrayed", "played"), ("voiced", "spoken"),
    ("wrote", "penned"), ("written", "penned"), ("won", "took"), ("near", "close to"),
    ("often", "frequently"), ("frequently", "often"), ("important", "significant"),
    ("significant", "important"), ("originally", "initially"), ("initially", "originally"),
)
_FRONTED = re.compile(
    r"^(In|On|At|During|By|After|Before|Since|From|Following|Under|Throughout|Between)"
    r"\s([^,]{2,60}),\s+(.+)$", re.S)
_PLACEHOLDER = "\u0001"
_BORN = re.compile(r"(\S)\s*\(\s*born ([^()]{4,40}?)\s*\)(\s)")
_CAST = re.compile(r"^([^,()]*\u0001[^,()]*?) as (\S.*)$", re.S)


def paraphrase(prefix: str, answer: str, suffix: str) -> tuple[str, str]:
  """(clause text, rule) re-worded without touching the answer mention.

  Rules, in order: cast lists ("A as B" -> "B is played by A"), birth brackets
  ("A ( born 1950 ) is" -> "A, born 1950, is"), move a fronted adverbial ("In 1990, X did Y" -> "X did Y in 1990"),
  then synonym substitutions; if neither applies, prepend "Reportedly ,".
  """
  text = prefix + _PLACEHOLDER + suffix
  rules = []
  cast = _CAST.match(text)
  if cast and len(cast.group(1).split()) <= 6:
    text, rules = f"{cast.group(2).rstrip(' .')} is played by {cast.group(1)}", ["cast"]
  born = _BORN.sub(r"\1, born \2,\3", text, count=1)
  if born != text:
    text, rules = born, rules + ["born"]
  moved = _move_fronted(text)
  if moved != text:
    text, rules = moved, ["front"]
  swapped = text if rules == ["cast"] else _substitute(text)
  if swapped != text:
    text, rules = swapped, rules + ["synonym"]
  if not rules:
    text, rules = "Reportedly , " + _lower_first(text), ["frame"]
  return text.replace(_PLACEHOLDER, answer), "+".join(rules)


_FUNCTION_WORDS = frozenset(("The", "A", "An", "It", "This", "These", "Those", "There",
                             "Its", "Their", "His", "Her", "In", "On", "At", "After",
                             "Before", "During", "Other", "Some", "Most", "Many", "Each",
                             "As", "Since", "When", "While", "Although", "Though", "With",
                             "According", "Following", "Despite", "Unlike", "Like", "By",
                             "For", "From", "Under", "Over", "Upon", "Both", "All", "One",
                             "Two", "Several", "Although", "If", "Once", "Then", "Today"))


def _lower_first(text: str) -> str:
  """Lower-case the first word if it is a capitalised function word."""
  first = text.split(" ", 1)[0]
  return text[0].lower() + text[1:] if first in _FUNCTION_WORDS else text


def _move_fronted(text: str) -> str:
  m = _FRONTED.match(text)
  if not m or _PLACEHOLDER in m.group(1) + m.group(2) or len(m.group(2).split()) > 6:
    return text
  head, phrase, rest = m.group(1), m.group(2).strip(), m.group(3)
  end = ""
  stripped = rest.rstrip()
  if stripped and stripped[-1] in ".!?":
    stripped, end = stripped[:-1].rstrip(), " " + stripped[-1]
  if not stripped:
    return text
  if stripped[0] != _PLACEHOLDER:
    stripped = stripped[0].upper() + stripped[1:]
  return f"{stripped} {head.lower()} {phrase}{end}"


def _substitute(text: str) -> str:
  for old, new in _SYNONYMS:
    pattern = r"(?<![A-Za-z0-9\-])" + re.escape(old) + r"(?![A-Za-z0-9\-])"
    out = re.sub(pattern, new, text, count=1)
    if out != text:
      return _substitute_rest(out, old)
  return text


def _substitute_rest(text: str, used: str) -> str:
  """At most two substitutions per clause (a light paraphrase)."""
  for old, new in _SYNONYMS:
    if old == used or new == used:
      continue
    pattern = r"(?<![A-Za-z0-9\-])" + re.escape(old) + r"(?![A-Za-z0-9\-])"
    out = re.sub(pattern, new, text, count=1)
    if out != text:
      return out
  return text


_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kl", "l", "m", "n", "p", "r",
           "s", "st", "t", "tr", "v", "z", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ei")
_CODAS = ("", "", "n", "r", "s", "l", "m", "th", "x")
_PLACE_SUFFIX = ("ia", "burg", "stad", "ora", "wick", "mere", "holm")


def _stream(key: str):
  """Deterministic bytes from a string key (sha256 chain)."""
  counter = 0
  while True:
    yield from hashlib.sha256(f"{key}/{counter}".encode()).digest()
    counter += 1


def _word(rng, syllables: int) -> str:
  parts = []
  for _ in range(syllables):
    parts.append(_ONSETS[next(rng) % len(_ONSETS)] + _VOWELS[next(rng) % len(_VOWELS)]
                 + _CODAS[next(rng) % len(_CODAS)])
  return "".join(parts).capitalize()


def invented_name(key: str, atype: str, n_words: int) -> str:
  """An invented proper name of type `atype` with `n_words` words (1-3), from `key`."""
  rng = _stream(key)
  n_words = max(1, min(3, n_words))
  words = [_word(rng, 1 + next(rng) % 2) for _ in range(n_words)]
  if atype == "PLACE":
    words[-1] = words[-1] + _PLACE_SUFFIX[next(rng) % len(_PLACE_SUFFIX)]
  return " ".join(words)
