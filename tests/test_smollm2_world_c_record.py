"""The recorded evaluations behind docs/smollm2_cer.md's shortcut-world verdicts (issue #36
item 2) re-decided from their per-item rows: docs/runs/issue36_world_c.tar.gz holds the
six runs' (baseline and CER, seeds 0–2) eval_trained/ (summary.json, per-item batches), config.json and metrics.jsonl;
`evaluate.report` over them must print the verdicts and numbers the docs and the README
quote (no model is loaded)."""
from __future__ import annotations

import pytest

from ceu_jax.finetune import evaluate as cer_eval
from tests.conftest import extract_recorded_run

ARCHIVE = 'issue36_world_c.tar.gz'   # in docs/runs
RUNS = {'baseline/s0': 'pw_ft_c', 'baseline/s1': 'pw_ft_c_s1', 'baseline/s2': 'pw_ft_c_s2',
        'cer/s0': 'pw_cer_c', 'cer/s1': 'pw_cer_c_s1', 'cer/s2': 'pw_cer_c_s2'}


@pytest.fixture(scope='module')
def text(tmp_path_factory):
  root = tmp_path_factory.mktemp('world_c')
  extract_recorded_run(ARCHIVE, root)
  entries = [(label, str(root / run / 'eval_trained' / 'summary.json'))
             for label, run in RUNS.items()]
  return cer_eval.report(entries, str(root / 'report'))


def _verdict(text: str, name: str) -> str:
  (line,) = [l for l in text.splitlines() if l.startswith(f'| {name} |')]
  return line.split(' | ')[2]


def test_the_recorded_runs_give_the_documented_verdicts(text):
  assert _verdict(text, 'H1 SmolLM2-135M baseline [memorised]') == '**not supported**'
  assert _verdict(text, 'H1 SmolLM2-135M baseline') == '**not supported**'
  # three seeds: H2 fails as stated in every scope, on its CEU_dis part only
  for scope in ('', ' [memorised]', ' [evidence_only]'):
    for den in ('fixed denominator', '§1 denominator'):
      name = f'H2 SmolLM2-135M{scope}, cer vs baseline ({den})'
      assert _verdict(text, name) == '**not supported**', name
      (line,) = [l for l in text.splitlines() if l.startswith(f'| {name} |')]
      assert ') → supported; Δceu_dis < 0' in line and ') → not supported; EM cost' in line
      assert line.endswith('→ holds |'), name


def test_the_recorded_runs_give_the_documented_numbers(text):
  lines = text.splitlines()
  row = lambda head: next(l for l in lines if l.startswith(head))
  assert ('+0.232 ± 0.086 over 3 seeds (s0: +0.319 [+0.203, +0.439] n=40; s1: +0.230 '
          '[+0.113, +0.342] n=40; s2: +0.147 [+0.078, +0.237] n=40)') in row(
      '| ceu_ev_fixed [memorised] |')
  assert '+0.225 ± 0.090 over 3 seeds (s0: +0.325 [+0.200, +0.475] n=40; s1: +0.200' in row(
      '| supported [memorised] |')
  assert '+0.106 ± 0.031 over 3 seeds' in row('| ceu_ev_fixed (degenerate = 0) |')
  assert '-0.001 ± 0.001 over 3 seeds' in row('| ceu_dis (§1: non-degenerate in both) |')
  assert '-0.006 ± 0.060 over 3 seeds' in row('| em |')
  assert '| baseline/s0 | memorised | 40 | 1.000 [1.000, 1.000] |' in text
  assert row('| baseline/s0 | memorised |').endswith('| 0.425 [0.275, 0.575] |')
  assert row('| baseline/s1 | memorised |').endswith('| 0.250 [0.125, 0.400] |')
  assert row('| baseline/s2 | memorised |').endswith('| 0.325 [0.175, 0.475] |')
  assert '| cer/s0 | 25 | 0.600 | 0.487 | 0.166 |' in text
  assert '| cer/s2 | 25 | 0.720 | 0.510 | 0.217 |' in text
