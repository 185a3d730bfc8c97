"""Bad input gets one line, exit code 1 and no debris (scripts/bad_input.py's cases; the
table in docs/bad_input.md comes from the same cases)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("bad_input", os.path.join(ROOT, "scripts",
                                                                         "bad_input.py"))
bad_input = importlib.util.module_from_spec(_spec)
sys.modules["bad_input"] = bad_input      # dataclasses look their module up there
_spec.loader.exec_module(bad_input)


@pytest.fixture(scope="module")
def results():
  return dict(zip((c.what for c in bad_input.CASES), bad_input.run_all()))


@pytest.mark.parametrize("case", bad_input.CASES, ids=lambda c: c.what.replace(" ", "_"))
def test_one_line_exit_1_and_no_debris(results, case):
  r = results[case.what]
  assert r["returncode"] == 1, r
  assert len(r["lines"]) == 1 and r["lines"][0].startswith("error: "), r["lines"]
  assert r["expected"] in r["lines"][0], (r["expected"], r["lines"][0])
  assert r["lines"][0].endswith("(--verbosity=1 shows the traceback)")
  assert r["workdir"] == case.workdir_left, r


def test_the_docs_table_lists_every_case():
  with open(os.path.join(ROOT, "docs", "bad_input.md")) as f:
    text = f.read()
  for case in bad_input.CASES:
    assert f"| {case.what} |" in text, case.what
