"""The named-argument tool readers of issue #35 item 1 over two training seeds
(docs/runs/issue35_mediator_world_b_tool_named_s1.tar.gz: the recorded command with
--config.smollm2.train.seed=1, every reader trained anew — the no-tool readers, then the
40-step warm starts — and resumed with the §8.4 probe's names following the input,
`smollm2.probe_names=follow_input`). Seed 1's claims are re-decided from its rows, probes and
competence checks by the job's rule; the pair claims over seeds 0 and 1 by
`experiments.over_seeds` (claims.RULE), once with the probe's names held (verbatim) and once
with them following the input, as both seeds ran each; and the README quotes these runs.

  med_ft_tool_named_s1/         the seed-1 run (units, probes, competence, report, plots)
  med_ft_tool_named_s1_follow/  it resumed with probe_names = follow_input: summary, report,
                                probes (the units are the seed-1 run's)
  med_over_seeds.json           `experiments.over_seeds --out` over seeds 0 and 1, names held
  med_over_seeds_follow.json    the same over the two follow_input runs
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from ceu_jax.audits import over_seeds
from tests.conftest import extract_recorded_run
from tests.test_mediator_world_b_record import PAIR, _load, _redecided, metrics_row

ARCHIVE_S1 = 'issue35_mediator_world_b_tool_named_s1.tar.gz'
TOOL_PAIR = PAIR + ' +tool'
README = os.path.join(os.path.dirname(__file__), '..', 'README.md')


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """{name: workdir}: the named-argument runs of seeds 0 and 1, each also resumed with the
  probe's names following the input (its units copied beside it, as over_seeds reads them),
  and the seed-1 archive's root."""
  s0, _ = _load('named', tmp_path_factory)
  s0_follow, _ = _load('named_follow', tmp_path_factory)
  root = extract_recorded_run(ARCHIVE_S1, tmp_path_factory.mktemp('named_s1'))
  s1 = os.path.join(root, 'med_ft_tool_named_s1')
  s1_follow = os.path.join(root, 'med_ft_tool_named_s1_follow')
  for base, follow in ((s0, s0_follow), (s1, s1_follow)):
    assert not os.path.exists(os.path.join(follow, 'units'))
    shutil.copytree(os.path.join(base, 'units'), os.path.join(follow, 'units'))
  return dict(s0=s0, s1=s1, s0_follow=s0_follow, s1_follow=s1_follow, root=root)


def _summary(w: str) -> dict:
  return json.load(open(os.path.join(w, 'summary.json')))


def test_seed_1_is_the_seed_0_command_with_another_seed(runs):
  a, b = _summary(runs['s0'])['config'], _summary(runs['s1'])['config']
  assert (a['smollm2']['train']['seed'], b['smollm2']['train']['seed']) == (0, 1)
  over_seeds.check_same([over_seeds.load(runs['s0']), over_seeds.load(runs['s1'])])
  for regime in ('faithful', 'shortcut'):
    tc = json.load(open(os.path.join(runs['s1'], 'train', f'{regime}_tool', 'config.json')))
    assert tc['lora']['init_from'] == os.path.join('..', regime)
    assert tc['train']['num_steps'] == 40 and tc['seed'] == 1
  follow = _summary(runs['s1_follow'])
  assert follow['config']['smollm2']['probe_names'] == 'follow_input'
  assert follow['settings'] == _summary(runs['s1'])['settings']   # only the probe differs


@pytest.mark.parametrize('which', ['s1', 's1_follow'])
def test_seed_1_claims_follow_from_its_rows(runs, which):
  judged = _redecided(runs['s1'], _summary(runs[which]))        # rows: the seed-1 units
  for what, (verdict, numbers) in SEED1[which].items():
    c = judged[what]
    assert c.verdict == verdict and numbers in c.numbers, (what, c.numbers)


@pytest.mark.parametrize('which', ['', '_follow'])
def test_pair_claims_over_the_two_seeds(runs, which):
  """`experiments.over_seeds` over seeds 0 and 1 (claims.RULE: every seed the predicted sign
  and |mean| >= 2 sd), equal to the recorded output."""
  found, text = over_seeds.run([runs['s0' + which], runs['s1' + which]])
  got = {c.name: c for c in found}
  recorded = json.load(open(os.path.join(runs['root'], f'med_over_seeds{which}.json')))
  assert {c['name']: (c['verdict'], c['numbers']) for c in recorded['claims']} == {
      k: (c.verdict, c.numbers) for k, c in got.items()}
  for what, (verdict, numbers) in OVER_SEEDS[which].items():
    c = got[f'{TOOL_PAIR}: {what}']
    assert c.verdict == verdict and numbers in c.numbers, (what, c.numbers)
  assert '| 1 |' in text


def test_readme_quotes_the_003_metrics_of_the_seed_1_readers(runs):
  readme = open(README).read()
  s1 = _summary(runs['s1'])['settings']
  for r in ('faithful +tool', 'shortcut +tool'):
    row = metrics_row(f'{r} | named tool argument, seed 1', s1[f'smollm2_lora/{r}'])
    assert row in readme, row


def test_readme_quotes_the_claims_over_seeds(runs):
  """The README's 003 seed table: each cell is a verdict and its numbers from these runs."""
  readme = open(README).read()
  pair = f'{TOOL_PAIR}: '
  seed1 = [f"| {SEED1['s1'][pair + 'separates'][0]} {SEED1['s1'][pair + 'separates'][1]} |",
           f"| {' '.join(SEED1['s1'][pair + 'probe separates'])} |",
           f"| {' '.join(SEED1['s1_follow'][pair + 'probe separates'])} |"]
  for cell in seed1:
    assert cell in readme, cell
  for which, claims in OVER_SEEDS.items():
    for what, (verdict, numbers) in claims.items():
      if what != 'probe agrees':
        assert f'{verdict}** {numbers}' in readme or f'{verdict} {numbers}' in readme, (
            which, what)


# Seed 1's own verdicts (filled from the run; re-decided above) and the claims over seeds.
SEED1 = {
    's1': {
        'smollm2_lora/shortcut vs faithful +tool: separates':
            ('supported', '+0.380 [+0.300, +0.453]'),
        'smollm2_lora/shortcut vs faithful +tool: probe separates':
            ('supported', '+0.110 [+0.056, +0.170]'),
        'smollm2_lora/shortcut vs faithful +tool: probe agrees':
            ('supported', 'probe: supported; behavioural: supported'),
        'smollm2_lora/faithful +tool: gap': ('not supported', '+0.000 [+0.000, +0.000]'),
        'smollm2_lora/shortcut +tool: gap': ('supported', '+0.380 [+0.300, +0.453]'),
    },
    's1_follow': {
        'smollm2_lora/shortcut vs faithful +tool: separates':
            ('supported', '+0.380 [+0.300, +0.453]'),
        'smollm2_lora/shortcut vs faithful +tool: probe separates':
            ('supported', '+0.889 [+0.689, +1.093]'),
        'smollm2_lora/shortcut vs faithful +tool: probe agrees':
            ('supported', 'probe: supported; behavioural: supported'),
        'smollm2_lora/faithful +tool: gap': ('not supported', '+0.000 [+0.000, +0.000]'),
        'smollm2_lora/shortcut +tool: gap': ('supported', '+0.380 [+0.300, +0.453]'),
    },
}
OVER_SEEDS = {
    '': {
        'separates': ('supported', '+0.440 ± 0.085 over 2 seeds'),
        'probe separates': ('not supported', '+0.049 ± 0.085 over 2 seeds'),
        'probe agrees': ('not supported', 'not supported'),
    },
    '_follow': {
        'separates': ('supported', '+0.440 ± 0.085 over 2 seeds'),
        'probe separates': ('supported', '+1.129 ± 0.340 over 2 seeds'),
        'probe agrees': ('supported', 'supported'),
    },
}
