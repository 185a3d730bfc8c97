"""The README's Python example runs as printed (the block under "Use it from Python")."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.test_multiprocess_helpers import fast_compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_readme_python_example_runs():
  text = open(os.path.join(ROOT, "README.md")).read()
  section = text.split("## Use it from Python", 1)[1]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  # Compiled with most XLA optimisations off (tests/test_multiprocess_helpers.py): the test
  # checks that the example runs and prints a summary, not its number (13.5 -> 5.7 user-s).
  env = fast_compile_env(dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "'value':" in out.stdout and "'n':" in out.stdout


def test_readme_links_to_files_that_exist():
  text = open(os.path.join(ROOT, "README.md")).read()
  for link in re.findall(r"\]\(((?:docs|configs|ceu_jax)/[^)#]*)\)", text):
    assert os.path.exists(os.path.join(ROOT, link)), link


def test_docs_pages_link_to_files_that_exist():
  docs = os.path.join(ROOT, "docs")
  for name in sorted(os.listdir(docs)):
    if not name.endswith(".md"):
      continue
    text = open(os.path.join(docs, name)).read()
    for link in re.findall(r"\]\(([\w./-]+)\)", text):
      if link.startswith(("http", "mailto")):
        continue
      assert os.path.exists(os.path.normpath(os.path.join(docs, link))), (name, link)


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_anchors_name_a_heading():
  text = open(os.path.join(ROOT, "README.md")).read()
  slugs = _slugs(os.path.join(ROOT, "README.md"))
  anchors = re.findall(r"\]\(#([^)]+)\)", text)
  assert anchors, "the README links to its own sections"
  for a in anchors:
    assert a in slugs, a


def _slugs(path: str) -> set[str]:
  with open(path) as f:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", f.read(), re.M)}


def test_links_into_another_page_name_a_heading_there():
  """`[..](docs/x.md#anchor)` in the README or a docs page: the page exists and has a heading
  whose GitHub anchor is `anchor` (a heading renamed would leave the link dead)."""
  pages = ["README.md"] + [os.path.join("docs", n) for n in sorted(os.listdir(
      os.path.join(ROOT, "docs"))) if n.endswith(".md")]
  checked = 0
  for page in pages:
    text = open(os.path.join(ROOT, page)).read()
    for target, anchor in re.findall(r"\]\(([\w./-]+\.md)#([^)\s]+)\)", text):
      path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
      assert os.path.exists(path), (page, target)
      assert anchor in _slugs(path), (page, target, anchor)
      checked += 1
  assert checked, "no link into another page's section was found"
