"""Readable examples: evidence span in ⟦ ⟧, changed tokens in « », the CLI."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ceu_jax.data import corruptions, render_text
from tests.conftest import ATR_CONFIGS, fast_compile

ROOT = Path(__file__).resolve().parents[1]
CFG = ATR_CONFIGS["vfk_n128"]
EVIDENCE = re.compile(r"⟦ (.*?) ⟧")


def _sections(text: str) -> list[str]:
  return text.split("\n\n")[1:]            # drop the legend


def check_rendered(text: str, num: int) -> None:
  """Structure of show_examples / render_examples output for value_for_key."""
  examples = _sections(text)
  assert len(examples) == num
  for ex in examples:
    header, plus_and_rest = ex.split("  D+:\n", 1)
    answer = re.search(r"gold answer: (\S+)", header)[1]
    blocks = re.split(r"\n  D- (\w+) \(changed tokens: (\d+), has_evidence: (\w+)\):\n",
                      plus_and_rest)
    plus, minus = blocks[0], blocks[1:]
    assert [minus[i] for i in range(0, len(minus), 4)] == list(corruptions.CORRUPTIONS)
    spans = EVIDENCE.findall(plus)
    if "has_evidence: True" in header:
      assert len(spans) == 1
      line = render_text.parse_line_text(spans[0])
      assert " ".join(f"v_{v}" for v in line["values"]) == answer
    else:
      assert not spans
    assert "«" not in plus
    for i in range(0, len(minus), 4):
      name, n_changed, body = minus[i], int(minus[i + 1]), minus[i + 3]
      assert body.count("«") == body.count("»") == n_changed, name
      assert len(EVIDENCE.findall(body)) == len(spans)           # same span positions


def test_render_examples_marks_spans_and_changes(atr_data, atr_corrupted):
  plus = atr_data(CFG, 1024)
  minus = {name: atr_corrupted(CFG, 1024, name) for name in corruptions.CORRUPTIONS}
  text = render_text.render_examples(CFG, plus, minus, num=6)
  check_rendered(text, 6)
  assert "⟦ ID #" in text or "⟦ KEY k_" in text


def test_show_examples_library_function():
  """What the CLI prints, in-process (the tiny config with η = 0.2)."""
  from configs import atr_insert
  with fast_compile():
    text = render_text.show_examples(atr_insert.get_config("tiny,eta=0.2"), num=3)
  check_rendered(text, 3)


@pytest.mark.slow
def test_show_examples_cli():
  out = subprocess.run([sys.executable, "-m", "experiments.show_examples",
                        "--config", "configs/atr_insert.py:tiny"], cwd=ROOT, text=True,
                       capture_output=True, timeout=600, check=True).stdout
  check_rendered(out, 3)
