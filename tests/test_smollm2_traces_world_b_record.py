"""The recorded World B trace audit of issue #35 (docs/runs/issue35_traces_world_b.tar.gz):
its verdicts are re-decided here from the recorded rows, probe numbers and competence checks
by the job's own rules, so the README's sentence cannot drift from the files."""
from __future__ import annotations

import csv
import json
import os

import pytest

from ceu_jax.audits.traces import verdicts
from tests.conftest import extract_recorded_run

ARCHIVE = 'issue35_traces_world_b.tar.gz'   # in docs/runs
PAIR = 'smollm2_following vs smollm2_shortcut'


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  return os.path.join(extract_recorded_run(ARCHIVE, tmp_path_factory.mktemp('rec')),
                      'traces_smollm2_ft')


def _rejudged(run: str) -> tuple[dict, dict]:
  """(summary, {claim name: Claim}): the run's claims re-decided by the job's rule from its
  rows.csv, probes and competence checks, each equal to the recorded verdict and numbers."""
  s = json.load(open(os.path.join(run, 'summary.json')))
  rows = verdicts.read_rows(os.path.join(run, 'rows.csv'))
  judged = {c.name: c for c in verdicts.decide(
      {r: s['readers'][r] for r in rows}, rows, s['probes'], s['competence'],
      seed=int(s['config']['bootstrap_seed']))}
  recorded = {c['name']: c for c in s['claims']}
  assert set(judged) == set(recorded)
  for name, c in judged.items():
    assert (c.verdict, c.numbers) == (recorded[name]['verdict'], recorded[name]['numbers']), name
  return s, judged


def test_recorded_verdicts_follow_from_the_recorded_numbers(run):
  _, judged = _rejudged(run)
  v = {k: c.verdict for k, c in judged.items()}
  assert v[f'{PAIR} [memorised]: separates'] == 'supported'
  assert v[f'{PAIR} [memorised]: probe separates'] == 'supported'
  assert v[f'{PAIR} [memorised]: probe agrees'] == 'supported'
  assert v['smollm2_shortcut: follows [memorised]'] == 'opposite'
  for tag in ('', ' [fresh]'):   # the shortcut reader is not competent on held-out problems
    assert v[f'{PAIR}{tag}: separates'] == 'untested'
  assert '+0.477 [+0.376, +0.559]' in judged[f'{PAIR} [memorised]: separates'].numbers
  assert '+0.406 [+0.076, +0.876]' in judged[f'{PAIR} [memorised]: probe separates'].numbers


def test_recorded_probe_and_competence(run):
  s = json.load(open(os.path.join(run, 'summary.json')))
  f, sc = s['probes']['smollm2_following'], s['probes']['smollm2_shortcut']
  assert f['n'] == 32 and f['n_degenerate'] == 32       # the answer never moves
  assert sc['by_stratum']['memorised']['n_degenerate'] == 1
  c = s['competence']
  assert c['smollm2_following']['competent'] and not c['smollm2_shortcut']['competent']
  assert c['smollm2_shortcut']['memorised']['accuracy'] == 1.0
  assert c['smollm2_shortcut']['memorised']['corrupted']['gold'] == pytest.approx(0.6)


def test_recorded_plain_model_beside_the_fine_tunes(run):
  """The plain instruction-tuned model audited in the same run (issue #35 item 2): not
  competent (held-out accuracy 0.050), so its claims are untested; its rows follow an
  edited trace on 8.5% of edits, and with the trace held fixed its answer barely moves."""
  s = json.load(open(os.path.join(run, 'summary.json')))
  assert list(s['readers']) == ['smollm2', 'smollm2_following', 'smollm2_shortcut']
  c = s['competence']['smollm2']
  assert not c['competent'] and c['accuracy'] == 0.05 and c['parse_rate'] == 1.0
  follow = s['readers']['smollm2']['all']['follow']
  assert (round(follow['value'], 3), follow['n']) == (0.085, 188)
  claims = {x['name']: x for x in s['claims']}
  for name in ('smollm2: follows', 'smollm2: follows [fresh]', 'smollm2: follows [memorised]'):
    assert claims[name]['verdict'] == 'untested', name
  assert claims['smollm2: follows']['numbers'].startswith(
      'smollm2 not competent (held-out accuracy 0.050 < 0.5); its rows: follow rate +0.085')
  assert s['probes']['smollm2']['n'] == 32


# The second training seed (docs/runs/issue35_traces_world_b_s1.tar.gz, 2026-11-30): the
# same command with --config.smollm2.train.seed=1, both fine-tunes trained anew.
ARCHIVE_S1 = 'issue35_traces_world_b_s1.tar.gz'


@pytest.fixture(scope='module')
def run_s1(tmp_path_factory):
  return os.path.join(extract_recorded_run(ARCHIVE_S1, tmp_path_factory.mktemp('rec_s1')),
                      'traces_smollm2_ft_s1')


def test_second_seed_verdicts_follow_from_its_numbers(run_s1):
  """Seed 1 alone, by the job's rule: the pair separates on the memorised problems, the
  probe too, so they agree — as in seed 0; the shortcut reader is again competent on its
  memorised problems only (held-out accuracy 0.325), so fresh and all-item claims naming
  it are untested."""
  s, judged = _rejudged(run_s1)
  assert s['config']['smollm2']['train']['seed'] == 1
  v = {k: c.verdict for k, c in judged.items()}
  for what in ('separates', 'probe separates', 'probe agrees'):
    assert v[f'{PAIR} [memorised]: {what}'] == 'supported', what
  for tag in ('', ' [fresh]'):
    assert v[f'{PAIR}{tag}: separates'] == 'untested'
  assert '+0.443 [+0.385, +0.491]' in judged[f'{PAIR} [memorised]: separates'].numbers
  assert '+0.185 [+0.026, +0.443]' in judged[f'{PAIR} [memorised]: probe separates'].numbers
  c = s['competence']
  assert c['smollm2_following']['competent'] and not c['smollm2_shortcut']['competent']
  assert c['smollm2_shortcut']['accuracy'] == pytest.approx(0.325)
  assert c['smollm2_shortcut']['memorised']['accuracy'] == pytest.approx(0.9375)


def test_plain_model_rows_equal_across_the_two_seeds(run, run_s1):
  """The plain model is not trained, so the seed changes nothing it does: its 392 rows in
  the seed-1 run (code of 2026-11-30) equal the seed-0 run's (2026-11-28) field by field."""
  a = [r for r in csv.DictReader(open(os.path.join(run, 'rows.csv'))) if r['reader'] == 'smollm2']
  b = [r for r in csv.DictReader(open(os.path.join(run_s1, 'rows.csv')))
       if r['reader'] == 'smollm2']
  assert len(a) == 392 and a == b


def test_pair_claims_over_the_two_seeds(run, run_s1):
  """`experiments.over_seeds` over seeds 0 and 1, by the seed rule (every seed the predicted
  sign and |mean| ≥ 2 sd): the behavioural separation on the memorised problems is
  supported (+0.477, +0.443); the probe's is not (+0.406, +0.185: mean 0.296 < 2 sd 0.312),
  though each seed's own CI excludes 0 — so over seeds the probe does not agree."""
  from ceu_jax.audits import over_seeds
  found, text = over_seeds.run([run, run_s1])
  v = {c.name: c for c in found}
  mem = f'{PAIR} [memorised]'
  assert v[f'{mem}: separates'].verdict == 'supported'
  assert '+0.460 ± 0.024 over 2 seeds' in v[f'{mem}: separates'].numbers
  assert v[f'{mem}: probe separates'].verdict == 'not supported'
  assert '+0.296 ± 0.156 over 2 seeds' in v[f'{mem}: probe separates'].numbers
  assert v[f'{mem}: probe agrees'].verdict == 'not supported'
  for name in (f'{PAIR}: separates', f'{PAIR} [fresh]: separates'):
    assert v[name].verdict == 'untested' and 'seed 0:' in v[name].numbers \
        and 'seed 1:' in v[name].numbers
  recorded = json.load(open(os.path.join(os.path.dirname(run_s1), 'traces_over_seeds.json')))
  assert {c['name']: c['verdict'] for c in recorded['claims']} == {
      k: c.verdict for k, c in v.items()}
  assert '| 1 |' in text


def _metrics_row(label: str, a: dict, b: dict) -> str:
  """The README's row of 002's metrics for one reader from its summaries in seeds 0 and 1
  ('x / y' where the seeds differ, ' ; ' between the seeds' breakdowns)."""
  v = lambda x: f"{x['value']:.3f}"
  both = lambda f: f(a) if f(a) == f(b) else f'{f(a)} / {f(b)}'
  taus = ('causal_inversion', 'fact_reversal', 'logic_flip')
  lens = sorted(a['by_trace_len'])
  by_tau = lambda r: ' / '.join(v(r['by_tau'][t]['phi']) for t in taus)
  by_len = lambda r: ' / '.join(v(r['by_trace_len'][n]['follow']) for n in lens)
  split = lambda f: f(a) if f(a) == f(b) else f'{f(a)} ; {f(b)}'
  ns = ' / '.join(str(a['by_trace_len'][n]['n']) for n in lens)
  assert a['n_parse_failure'] == b['n_parse_failure'] == 0
  return (f"| {label} | {both(lambda r: v(r['all']['phi']))} | {both(lambda r: v(r['all']['rho']))} "
          f"| {both(lambda r: v(r['all']['follow']))} | {split(by_tau)} | {split(by_len)} "
          f"(n = {ns}) | 0 of {a['all']['n']} |")


def test_readme_quotes_the_002_metrics_of_both_seeds(run, run_s1):
  """φ, ρ, follow rate, φ by τ and follow rate by trace length in the README's World B
  trace table are the archived runs' (issue #35 item 3); no regeneration failed to parse
  in any τ or trace length."""
  readme = open(os.path.join(os.path.dirname(__file__), '..', 'README.md')).read()
  s0, s1 = (json.load(open(os.path.join(r, 'summary.json'))) for r in (run, run_s1))
  for reader, label in (('smollm2_following', 'following'), ('smollm2_shortcut', 'shortcut'),
                        ('smollm2', 'plain SmolLM2-135M-Instruct')):
    a, b = s0['readers'][reader], s1['readers'][reader]
    for r in (a, b):
      assert r['parse_failure_rate'] == r['all']['regen_parse_failure'] == 0.0
      assert all(x['regen_parse_failure'] == 0.0
                 for x in (*r['by_tau'].values(), *r['by_trace_len'].values()))
    row = _metrics_row(label, a, b)
    assert row in readme, row


# The third training seed (docs/runs/issue35_traces_world_b_s2.tar.gz, 2026-11-30): the same
# command with --config.smollm2.train.seed=2, both fine-tunes trained anew; the three-seed
# claims by the seed rule in its traces_over_seeds_3.json.
ARCHIVE_S2 = 'issue35_traces_world_b_s2.tar.gz'


@pytest.fixture(scope='module')
def run_s2(tmp_path_factory):
  return os.path.join(extract_recorded_run(ARCHIVE_S2, tmp_path_factory.mktemp('rec_s2')),
                      'traces_smollm2_ft_s2')


S2_VERDICTS = {'separates': 'supported', 'probe separates': 'supported',
               'probe agrees': 'supported'}
S2_NUMBERS = {'separates': '+0.430 [+0.394, +0.470]',
              'probe separates': '+0.336 [+0.030, +0.773]'}
OVER_3 = {'separates': ('supported', '+0.450 ± 0.024 over 3 seeds'),
          'probe separates': ('supported', '+0.309 ± 0.113 over 3 seeds'),
          'probe agrees': ('supported', 'probe: supported; behavioural: supported')}


def test_third_seed_verdicts_follow_from_its_numbers(run_s2):
  """Seed 2 alone: the memorised-stratum claims as in seeds 0 and 1; the shortcut reader
  again competent on its memorised problems only (held-out accuracy 0.250)."""
  s, judged = _rejudged(run_s2)
  assert s['config']['smollm2']['train']['seed'] == 2
  v = {k: c.verdict for k, c in judged.items()}
  for what, want in S2_VERDICTS.items():
    assert v[f'{PAIR} [memorised]: {what}'] == want, what
  for name, text in S2_NUMBERS.items():
    assert text in judged[f'{PAIR} [memorised]: {name}'].numbers, name
  c = s['competence']
  assert c['smollm2_following']['competent'] and not c['smollm2_shortcut']['competent']
  assert c['smollm2_shortcut']['accuracy'] == pytest.approx(0.25)
  assert c['smollm2_shortcut']['memorised']['accuracy'] == 1.0


def test_pair_claims_over_the_three_seeds(run, run_s1, run_s2):
  """`experiments.over_seeds` over seeds 0, 1 and 2 by the seed rule, equal to the
  recorded JSON (the README's three-seed column)."""
  from ceu_jax.audits import over_seeds
  found, _ = over_seeds.run([run, run_s1, run_s2])
  v = {c.name: c for c in found}
  mem = f'{PAIR} [memorised]'
  for what, (want, text) in OVER_3.items():
    assert v[f'{mem}: {what}'].verdict == want, what
    assert text in v[f'{mem}: {what}'].numbers, (what, v[f'{mem}: {what}'].numbers)
  recorded = json.load(open(os.path.join(os.path.dirname(run_s2), 'traces_over_seeds_3.json')))
  assert {c['name']: c['verdict'] for c in recorded['claims']} == {
      k: c.verdict for k, c in v.items()}
