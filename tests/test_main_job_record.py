"""The recorded run behind the README's main-job table (command 1), re-aggregated.

docs/runs/main_job.tar.gz holds command 1's run as it finished: every cell's result.json
(its rows, config, code version and timing) and audit/examples.csv (the per-item rows the
paired claims are decided on; no checkpoints), and the claims.md the run printed. Made
from a finished workdir W by
  tar -czf docs/runs/main_job.tar.gz -C W claims.md cells/*/result.json \
      cells/*/audit/examples.csv cells/*/conditions/*/examples.csv
(the recorded run predates the per-condition rows: its H3 rows are condition-level). Its
claims.md was re-aggregated from the same cells when H3 became one part per growing knob
and H4 came to need attention and SSM (docs/main_job.md says what moved).
Aggregating those cells with today's code (`grid.main.run(..., aggregate_only=True)`, what
command 1 does after its last cell) must find that every recorded cell is still a cell of
configs/smoke.py's grid and write the claims.md that was recorded; the README's table and
docs/main_job.md must quote its verdicts. A change of the grid's config, of the claims'
rule or of the README that the record does not follow fails here (the record went stale
once, unnoticed: issue #37, 2026-11-29). Re-running the 14-minute job is not a test;
whoever changes what it computes re-records it.
"""
from __future__ import annotations

import os
import re

import pytest

from ceu_jax.grid import main as grid_main
from configs import smoke
from tests.conftest import extract_recorded_run

ARCHIVE = 'main_job.tar.gz'   # in docs/runs
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ('attention', 'ssm', 'memory_port')
VARIANT = ' (beta_swap=1.0, lambda_ev=1.0)'
VERDICTS = ('supported', 'not supported', 'opposite', 'untested')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """(recorded claims.md text, re-decided claims.md text, grid_main.run's answer)."""
  w = str(tmp_path_factory.mktemp('main_job'))
  extract_recorded_run(ARCHIVE, w)
  with open(os.path.join(w, 'claims.md')) as f:
    recorded = f.read()
  out = grid_main.run(smoke.get_config(None), w, aggregate_only=True, log=lambda *_: None)
  with open(os.path.join(w, 'claims.md')) as f:
    return recorded, f.read(), out


def verdicts(claims_md: str) -> dict[str, str]:
  """claim name -> verdict, from a claims.md table."""
  out = {}
  for line in claims_md.splitlines():
    if line.startswith('| H'):
      cells = [c.strip() for c in line.strip().strip('|').split('|')]
      out[cells[0]] = cells[2].strip('*')
  return out


def readme_table() -> dict[str, list[str]]:
  """Row head (H1, H2 evidence, H2 evidence + distractor, H3, H4) -> the three family
  cells of the README's main-job table."""
  with open(os.path.join(ROOT, 'README.md')) as f:
    text = f.read()
  start = text.index('### The main job (seed 000, SPEC §6)')
  rows = {}
  for line in text[start:].splitlines():
    if line.startswith('| **H'):
      cells = [c.strip() for c in line.strip().strip('|').split('|')]
      head = re.match(r'\*\*(H\d)\*\*', cells[0]).group(1)
      if head == 'H2':
        head += ' evidence + distractor' if 'distractor' in cells[0] else ' evidence'
      rows[head] = cells[1:]
    elif rows and not line.startswith('|'):
      break
  return rows


def bold(cell: str) -> str:
  m = re.match(r'\*\*([a-z ]+)\*\*', cell)
  assert m and m.group(1) in VERDICTS, cell
  return m.group(1)


def test_every_recorded_cell_is_in_the_grid_and_the_claims_re_decide_unchanged(run):
  recorded, redecided, out = run
  assert out['other_cells'] == 0 and out['failures'] == 0
  assert out['rows'] == 18 * 6   # 18 cells x (clean; δ 0.6, 0.9; n 128; η 0.0, 0.6)
  assert redecided == recorded


def test_the_readme_table_quotes_the_recorded_verdicts(run):
  v = verdicts(run[0])
  rows = readme_table()
  assert set(rows) == {'H1', 'H2 evidence', 'H2 evidence + distractor', 'H3', 'H4'}
  for fam, cell in zip(FAMILIES, rows['H1']):
    assert bold(cell) == v[f'H1 {fam}'], fam
    em = re.search(r'EM ≥ 0\.75 in every seed: \+(\d\.\d{3})', next(
        line for line in run[0].splitlines() if line.startswith(f'| H1 {fam} |'))).group(1)
    assert f'EM {em}' in cell, (fam, em)
  for row, reg in (('H2 evidence', 'evidence'), ('H2 evidence + distractor',
                                                 'evidence_distractor')):
    for fam, cell in zip(FAMILIES, rows[row]):
      assert bold(cell) == v[f'H2 {fam}, {reg}{VARIANT} (fixed denominator)'], (row, fam)
  for fam, cell in zip(FAMILIES, rows['H3']):
    ev, ed = v[f'H3 {fam}, evidence{VARIANT}'], v[f'H3 {fam}, evidence_distractor{VARIANT}']
    if ev == ed:
      assert cell.startswith(f'**{ev}** (both variants)'), (fam, cell)
    else:
      assert cell.startswith(f'**{ev}** (evidence') and f'{ed} (ev + dis)' in cell, (fam, cell)
  ev, ed = v[f'H4 evidence{VARIANT}'], v[f'H4 evidence_distractor{VARIANT}']
  assert ev == ed and rows['H4'][0].startswith(f'**{ev}** (both variants)')


def test_docs_main_job_quotes_every_recorded_claim(run):
  with open(os.path.join(ROOT, 'docs', 'main_job.md')) as f:
    doc = f.read()
  lines = [line for line in run[0].splitlines() if line.startswith('| H')]
  assert len(lines) == 3 + 12 + 6 + 2
  for line in lines:
    assert line in doc, line[:80]
