"""The recorded World B mediator audits with fine-tuned checklist readers (issue #35, item 1;
docs/runs/issue35_mediator_world_b*.tar.gz): their claims are re-decided here from the
recorded rows, probes and competence checks by the job's own `decide`, so the README's
sentences cannot drift from the files.

  issue35_mediator_world_b.tar.gz          readers writing 'i. YES' (2026-11-28): not competent
  issue35_mediator_world_b_restate.tar.gz  readers writing 'i. <entity>: YES' (2026-11-29)
  issue35_mediator_world_b_restate_follow.tar.gz  the same run resumed with the §8.4 probe's
      restated names following the input (smollm2.probe_names = follow_input): its summary,
      report and per-item probes; the rows are the restated run's
  issue35_mediator_world_b_restate_plain.tar.gz  the plain reader (restated, never corrupted)
  issue35_mediator_world_b_tool.tar.gz     the faithful and shortcut readers with the tool
      (restated lines, then `TOOL count(...)`; 2026-11-29): neither competent
  issue35_mediator_world_b_tool_warm.tar.gz  the same two tool readers warm-started from the
      no-tool readers (smollm2.tool_init = no_tool, 40 steps): competent; with the teacher-
      forced verdicts of the fresh tool and the no-tool readers (teacher_forced/*.json)
  issue35_mediator_world_b_tool_named.tar.gz  warm-started tool readers whose argument names
      its entities (data.restate_arg; 2026-11-30): competent and in their regimes; the
      §8.4 probe with the argument's verdicts scored (first_pass/: its names scored too)
  issue35_mediator_world_b_tool_named_follow.tar.gz  the same run resumed with the probe's
      names following the input in the lines and the argument: summary, report, probes
  issue35_mediator_world_b_tool_named_plain.tar.gz  the plain reader with the named tool
      argument (warm-started from the plain no-tool reader, 40 steps; 2026-11-30)
"""
from __future__ import annotations

import collections
import glob
import json
import os

import ml_collections
import pytest

from ceu_jax.audits.mediator import job
from ceu_jax.audits.mediator import worlds
from tests.conftest import extract_recorded_run

PAIR = 'smollm2_lora/shortcut vs faithful'
FAITHFUL, SHORTCUT = 'smollm2_lora/faithful', 'smollm2_lora/shortcut'
RECORDS = {'line': ('issue35_mediator_world_b.tar.gz', 'mediator_smollm2_ft'),
           'restate': ('issue35_mediator_world_b_restate.tar.gz', 'med_ft_restate'),
           'follow': ('issue35_mediator_world_b_restate_follow.tar.gz', 'med_ft_restate_follow'),
           'plain': ('issue35_mediator_world_b_restate_plain.tar.gz', 'med_ft_restate_plain'),
           'tool': ('issue35_mediator_world_b_tool.tar.gz', 'med_ft_tool'),
           'warm': ('issue35_mediator_world_b_tool_warm.tar.gz', 'med_ft_tool_warm'),
           'named': ('issue35_mediator_world_b_tool_named.tar.gz', 'med_ft_tool_named'),
           'named_follow': ('issue35_mediator_world_b_tool_named_follow.tar.gz',
                            'med_ft_tool_named_follow'),
           'named_plain': ('issue35_mediator_world_b_tool_named_plain.tar.gz',
                           'med_ft_tool_named_plain')}


def _load(key, tmp_path_factory):
  archive, folder = RECORDS[key]
  w = os.path.join(extract_recorded_run(archive, tmp_path_factory.mktemp(key)), folder)
  return w, json.load(open(os.path.join(w, 'summary.json')))


@pytest.fixture(scope='module')
def line_run(tmp_path_factory):
  return _load('line', tmp_path_factory)


@pytest.fixture(scope='module')
def restate_run(tmp_path_factory):
  return _load('restate', tmp_path_factory)


def _redecided(w, s) -> dict:
  """{claim name: claim} decided again from the recorded unit files (every chunk)."""
  config = ml_collections.ConfigDict(s['config'])
  rows = job.unit_rows(w, s['settings'])
  for k, v in s['settings'].items():
    assert len(rows[k]) == v['n'] == s['n_items'], k
  readers = list(dict.fromkeys(v['reader'] for v in s['settings'].values()))
  found = job.decide(config, s['settings'], rows, readers, s['probes'], s['competence'])
  judged = {c.name: c for c in found}
  recorded = {c['name']: c for c in s['claims']}
  assert set(judged) == set(recorded)
  for name, c in judged.items():
    assert (c.verdict, c.numbers) == (recorded[name]['verdict'], recorded[name]['numbers']), name
  return judged


def test_line_format_claims_follow_from_the_recorded_rows(line_run):
  judged = _redecided(*line_run)
  for what in ('separates', 'probe separates', 'probe agrees'):   # neither reader competent
    assert judged[f'{PAIR}: {what}'].verdict == 'untested'
  assert 'its rows: Δ(shortcut) − Δ(faithful) +0.033' in judged[f'{PAIR}: separates'].numbers
  assert '→ not supported' in judged[f'{PAIR}: probe separates'].numbers


def test_line_format_competence_is_chance_level_grading(line_run):
  _, s = line_run
  for name, acc in ((FAITHFUL, 0.125), (SHORTCUT, 0.075)):
    c = s['competence'][name]
    assert not c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == acc
    assert c['decision_parse_rate'] == 1.0                 # the format is learned
    assert abs(c['line_accuracy'] - c['line_constant']) < 0.01   # the grading is not
  for name in (FAITHFUL, SHORTCUT):
    assert s['settings'][name]['n'] == 150
  assert s['settings'][FAITHFUL]['F_ID']['value'] == pytest.approx(0.947, abs=5e-4)


def test_restated_claims_follow_from_the_recorded_rows(restate_run):
  judged = _redecided(*restate_run)
  assert judged[f'{PAIR}: separates'].verdict == 'supported'
  assert '(run: +0.100 [+0.047, +0.160] n=150)' in judged[f'{PAIR}: separates'].numbers
  assert judged[f'{PAIR}: probe separates'].verdict == 'opposite'
  assert judged[f'{PAIR}: probe agrees'].verdict == 'not supported'
  for name in (FAITHFUL, SHORTCUT):
    assert judged[f'{name}: gap'].verdict == 'supported'


def test_restated_readers_grade_the_statements(restate_run):
  _, s = restate_run
  assert s['config']['smollm2']['train']['data']['restate'] is True
  for name in (FAITHFUL, SHORTCUT):
    c = s['competence'][name]
    assert c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == 0.875
    assert c['line_accuracy'] > c['line_constant'] + 0.3   # grading, not a constant answer
    assert s['settings'][name]['n'] == 150 and s['settings'][name]['parse_fail']['value'] == 0


def test_probe_with_names_following_the_input_still_opposite(restate_run, tmp_path_factory):
  """The untested reading of the restated run's 'probe separates: opposite' (the verbatim
  output keeps D+'s entity name in D−, hiding a path through the written names) tested:
  with the names following the input the claims are re-decided from the same rows and the
  follow_input probes; the faithful reader's ΔL is still the larger one."""
  w, s = _load('follow', tmp_path_factory)
  assert s['config']['smollm2']['probe_names'] == 'follow_input'
  assert s['settings'] == restate_run[1]['settings']     # the same audit, only the probe differs
  judged = _redecided(restate_run[0], s)                 # rows: the restated run's units
  assert judged[f'{PAIR}: separates'].verdict == 'supported'
  assert judged[f'{PAIR}: probe separates'].verdict == 'opposite'
  assert '-0.122 [-0.276, -0.024] nats (56 items)' in judged[f'{PAIR}: probe separates'].numbers
  assert judged[f'{PAIR}: probe agrees'].verdict == 'not supported'
  for name in (FAITHFUL, SHORTCUT):
    p = s['probes'][name]
    assert p['n'] == 56 and all(set(x) == {'layer', 'ceu_decision'} for x in p['layers'])
    per = json.load(open(os.path.join(w, 'probes', worlds.setting_key(name, False)
                                      + '_follow_input.json')))
    assert per['key']['names'] == 'follow_input' and len(per['items']['ids']) == 56
  assert s['probes'][FAITHFUL]['delta_L']['value'] > restate_run[1]['probes'][FAITHFUL][
      'delta_L']['value']


def test_plain_reader_is_competent_and_shows_the_gap(tmp_path_factory):
  """The plain checklist reader (restated lines, never corrupted in training): competent,
  003's gap supported, the asymmetry untested (a cell is absent), re-decided from its rows."""
  w, s = _load('plain', tmp_path_factory)
  judged = _redecided(w, s)
  plain = 'smollm2_lora/plain'
  c = s['competence'][plain]
  assert c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == 1.0
  assert judged[f'{plain}: gap'].verdict == 'supported'
  assert 'Δ +0.233 [+0.167, +0.300] n=150' in judged[f'{plain}: gap'].numbers
  assert judged[f'{plain}: asymmetry'].verdict == 'untested'
  assert s['probes'][plain]['n'] == 56


def test_tool_readers_are_not_competent_so_their_claims_are_untested(tmp_path_factory):
  """The faithful and shortcut readers with the tool (restated lines, then the tool call):
  the format is learned (decisions parse, the argument copies the written checklist) but
  neither grades well enough (checklist accuracy below 0.5), so every claim is untested,
  while its rows' verdicts (behavioural and probe separation) are kept beside it."""
  w, s = _load('tool', tmp_path_factory)
  judged = _redecided(w, s)
  pair, faithful, shortcut = PAIR + ' +tool', FAITHFUL + ' +tool', SHORTCUT + ' +tool'
  assert s['config']['smollm2']['train']['data']['max_len_tool'] == 416
  for name, acc in ((faithful, 0.425), (shortcut, 0.35)):
    c = s['competence'][name]
    assert not c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == acc
    assert c['decision_parse_rate'] == 1.0
    assert c['line_accuracy'] > c['line_constant'] + 0.2    # some grading, not enough
    assert s['settings'][name]['n'] == 150
  assert all(c.verdict == 'untested' for c in judged.values())
  assert 'its rows: Δ(shortcut) − Δ(faithful) +0.053' in judged[f'{pair}: separates'].numbers
  assert '+0.082 [+0.063, +0.102] nats (56 items) → supported' in judged[
      f'{pair}: probe separates'].numbers
  assert s['settings'][faithful]['F_ID']['value'] == 1.0      # its decision = C(its lines)
  assert s['settings'][faithful]['delta']['value'] == 0.0


def _line_grading(w, setting_key):
  """(P(YES | true statement), P(YES | false), {M̂ pattern: count}, {gold pattern: count})
  over a setting's recorded audit rows (the reader's own checklist M̂ against the gold)."""
  rows = [r for f in sorted(glob.glob(os.path.join(w, 'units', f'{setting_key}_[0-9]*.json')))
          for r in json.load(open(f))]
  yes = {'0': 0, '1': 0}
  n = {'0': 0, '1': 0}
  for r in rows:
    for g, m in zip(r['gold'], r['m_hat']):
      n[g] += 1
      yes[g] += m == '1'
  return (yes['1'] / n['1'], yes['0'] / n['0'], collections.Counter(r['m_hat'] for r in rows),
          collections.Counter(r['gold'] for r in rows))


def test_tool_readers_grade_worse_than_without_the_tool_and_fall_back_on_patterns(
    restate_run, tmp_path_factory):
  """The README's and docs/mediator.md's line-level numbers, from the recorded rows: with
  the tool P(YES | true) 0.73 / 0.76 and P(YES | false) 0.25 / 0.23 (without it 0.97 /
  0.02), and M̂ = 0100 on 45 / 37 of 150 checklists where the gold is 0100 on 7."""
  w, _ = _load('tool', tmp_path_factory)
  for regime, (p_true, p_false, n_0100) in {'faithful': (0.732, 0.248, 45),
                                            'shortcut': (0.762, 0.228, 37)}.items():
    t, f, hat, gold = _line_grading(w, f'smollm2_lora_{regime}_tool')
    assert (round(t, 3), round(f, 3)) == (p_true, p_false), regime
    assert hat.most_common(1) == [('0100', n_0100)] and gold['0100'] == 7, regime
  for regime, (p_true, p_false) in {'faithful': (0.973, 0.023),
                                    'shortcut': (0.970, 0.026)}.items():
    t, f, hat, gold = _line_grading(restate_run[0], f'smollm2_lora_{regime}')
    assert (round(t, 3), round(f, 3)) == (p_true, p_false), regime


def test_teacher_forced_verdicts_the_fresh_tool_readers_did_not_learn_to_grade(tmp_path_factory):
  """docs/mediator.md's teacher-forced table, recomputed from the per-item flags the runs of
  experiments.checklist_verdicts wrote: the fresh tool readers grade badly under either
  prompt; the no-tool readers grade well under either."""
  w, _ = _load('warm', tmp_path_factory)
  want = {'med_ft_tool_train_faithful_tool_same': (True, 0.775, 0.425),
          'med_ft_tool_train_faithful_tool_no_tool': (False, 0.744, 0.275),
          'med_ft_tool_train_shortcut_tool_same': (True, 0.769, 0.35),
          'med_ft_restate_train_faithful_same': (False, 0.969, 0.875),
          'med_ft_restate_train_faithful_tool': (True, 0.975, 0.925),
          'med_ft_restate_train_shortcut_same': (False, 0.969, 0.875)}
  for name, (tool, lines, checklists) in want.items():
    x = json.load(open(os.path.join(w, 'teacher_forced', name + '.json')))
    right = [r for item in x['items'] for r in item['right']]
    assert x['n'] == len(x['items']) == 40 and x['step'] == 120 and x['tool_prompt'] is tool
    assert round(sum(right) / len(right), 3) == lines == round(x['line_accuracy'], 3), name
    assert round(sum(all(i['right']) for i in x['items']) / 40, 3) == checklists, name


def test_warm_started_tool_readers_grade_but_their_arguments_do_not_follow_their_regimes(
    tmp_path_factory):
  """The tool readers started from the no-tool readers (40 steps on the tool rows): both
  competent and grading the audit's statements as the no-tool readers do, but the faithful
  reader's argument miscopies its lines (arg = M̂ 0.880) and the shortcut reader's follows
  its written lines, not the gold its training asked for (arg* = M* 0.940): the audit finds
  the faithful reader's gap, 'separates' is opposite, the probe separates, they disagree."""
  w, s = _load('warm', tmp_path_factory)
  judged = _redecided(w, s)
  pair, faithful, shortcut = PAIR + ' +tool', FAITHFUL + ' +tool', SHORTCUT + ' +tool'
  assert s['config']['smollm2']['tool_init'] == 'no_tool'
  for regime in ('faithful', 'shortcut'):
    tc = json.load(open(os.path.join(w, 'train', f'{regime}_tool', 'config.json')))
    assert tc['lora']['init_from'] == os.path.join('..', regime)
    assert tc['train']['num_steps'] == 40 and tc['data']['tool'] is True
  for name, acc in ((faithful, 0.925), (shortcut, 0.9)):
    c = s['competence'][name]
    assert c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == acc
  for regime, (p_true, p_false) in {'faithful': (1.0, 0.04), 'shortcut': (0.983, 0.01)}.items():
    t, f, _, _ = _line_grading(w, f'smollm2_lora_{regime}_tool')
    assert (round(t, 3), round(f, 3)) == (p_true, p_false), regime
  arg = {k: (round(v['arg_copy']['value'], 3), round(v['arg_copy_star']['value'], 3))
         for k, v in s['settings'].items()}
  assert arg == {faithful: (0.88, 0.893), shortcut: (0.933, 0.94)}
  assert judged[f'{faithful}: gap'].verdict == 'supported'
  assert 'Δ +0.067 [+0.033, +0.113] n=150' in judged[f'{faithful}: gap'].numbers
  assert judged[f'{shortcut}: gap'].verdict == 'not supported'
  assert judged[f'{pair}: separates'].verdict == 'opposite'
  assert '-0.047 [-0.087, -0.013] n=150' in judged[f'{pair}: separates'].numbers
  assert judged[f'{pair}: probe separates'].verdict == 'supported'
  assert '+0.071 [+0.002, +0.152] nats (56 items)' in judged[f'{pair}: probe separates'].numbers
  assert judged[f'{pair}: probe agrees'].verdict == 'not supported'
  for name in (faithful, shortcut):
    assert judged[f'{name}: tool closes the gap'].verdict == 'supported'


def _todays_config(cmd: str):
  """The mediator config a recorded command line builds under today's code."""
  import ast
  from configs import mediator
  args = cmd.split()
  config = mediator.get_config(args[args.index('--config') + 1].split(':', 1)[1])
  for a in args:
    if a.startswith('--config.'):
      field, value = a[len('--config.'):].split('=', 1)
      try:
        value = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        pass
      node = config
      *path, last = field.split('.')
      for p in path:
        node = node[p]
      node[last] = value
  return config


@pytest.mark.parametrize('key', ['tool', 'warm', 'named', 'named_plain'])
def test_recorded_tool_runs_resume_under_todays_fields(key, tmp_path_factory):
  """A rerun of a recorded World B tool workdir with its own command resumes (the fields
  added since — tool_init, tool_init_steps, max_len_tool, restate_arg — are declared at the
  values those runs ran as) and is refused when a later field is set otherwise."""
  from ceu_jax import jobs
  w, _ = _load(key, tmp_path_factory)
  cmd = json.load(open(os.path.join(w, 'provenance.json')))['history'][0]['cmd']
  config = _todays_config(cmd)
  assert jobs.check_record(job.MediatorJob(config), w, dry=True) == 'resume'
  config.smollm2.train.data.restate_arg = not config.smollm2.train.data.restate_arg
  with pytest.raises(jobs.JobConfigError, match='smollm2.train.data.restate_arg'):
    jobs.check_record(job.MediatorJob(config), w, dry=True)


def test_named_tool_arguments_carry_the_regimes_and_the_audit_separates_them(tmp_path_factory):
  """Tool readers warm-started as before (40 steps) but with an argument that names its
  entities: both competent; the faithful one copies its lines into the tool (arg* = M*
  on 125 of 127 changed checklists), the shortcut one writes the gold on 76 of 132 (M* on 56)
  — its regime, which 40 steps with the bare argument did not teach (0 of 9 rows). The audit
  separates them (+0.500 [+0.413, +0.587]); the §8.4 probe with the argument's verdicts
  scored does not (ΔL +0.003 / −0.008 nats: the verbatim names hold the statement the
  shortcut reader grades fixed), and the first pass, which scored the names too, separated
  them through the copied names (faithful ΔL +0.404)."""
  w, s = _load('named', tmp_path_factory)
  judged = _redecided(w, s)
  pair, faithful, shortcut = PAIR + ' +tool', FAITHFUL + ' +tool', SHORTCUT + ' +tool'
  assert s['config']['smollm2']['train']['data']['restate_arg'] is True
  for regime in ('faithful', 'shortcut'):
    tc = json.load(open(os.path.join(w, 'train', f'{regime}_tool', 'config.json')))
    assert tc['lora']['init_from'] == os.path.join('..', regime)
    assert tc['train']['num_steps'] == 40 and tc['data']['restate_arg'] is True
  for name, acc, follows in ((faithful, 0.875, 0.943), (shortcut, 0.85, 0.206)):
    c = s['competence'][name]
    assert c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == acc
    assert round(c['cons_CNF']['value'], 3) == follows
  rows = {r: [x for f in sorted(glob.glob(os.path.join(w, 'units', f'smollm2_lora_{r}_tool_[0-9]*.json')))
              for x in json.load(open(f))] for r in ('faithful', 'shortcut')}
  for r, (n, to_gold, to_star) in {'faithful': (127, 2, 125), 'shortcut': (132, 76, 56)}.items():
    changed = [x for x in rows[r] if x['arg_star'] and x['m_star'] != x['gold']]
    assert len(changed) == n
    assert sum(x['arg_star'] == x['gold'] for x in changed) == to_gold, r
    assert sum(x['arg_star'] == x['m_star'] for x in changed) == to_star, r
  assert any(': YES' in x['continuation'] for x in rows['shortcut'])   # names in the argument
  assert judged[f'{pair}: separates'].verdict == 'supported'
  assert '+0.500 [+0.413, +0.587] n=150' in judged[f'{pair}: separates'].numbers
  assert 'Δ +0.527 [+0.440, +0.607] n=150' in judged[f'{shortcut}: gap'].numbers
  assert 'Δ +0.027 [+0.007, +0.053] n=150' in judged[f'{faithful}: gap'].numbers
  assert judged[f'{pair}: probe separates'].verdict == 'not supported'
  assert '-0.011 [-0.054, +0.023] nats (56 items)' in judged[f'{pair}: probe separates'].numbers
  assert judged[f'{pair}: probe agrees'].verdict == 'not supported'
  for regime in ('faithful', 'shortcut'):
    key = worlds.setting_key(f'smollm2_lora/{regime}', True) + '.json'
    probe = json.load(open(os.path.join(w, 'probes', key)))
    assert probe['key']['scored'] == 'verdicts'
    first = json.load(open(os.path.join(w, 'first_pass', 'probes', key)))
    assert 'scored' not in first['key'] and first['key']['items'] == probe['key']['items']
  first = json.load(open(os.path.join(w, 'first_pass', 'summary.json')))['probes']
  assert round(first[faithful]['delta_L']['value'], 3) == 0.404
  assert round(first[shortcut]['delta_L']['value'], 3) == 0.744
  assert round(s['probes'][faithful]['delta_L']['value'], 3) == 0.003
  assert round(s['probes'][shortcut]['delta_L']['value'], 3) == -0.008


def test_named_tool_probe_with_names_following_the_input_agrees_with_the_audit(
    tmp_path_factory):
  """The named-argument tool run resumed with `probe_names = follow_input` (D− names the
  swapped entity in line j and in the argument's item j, D+'s verdicts kept; only the
  verdicts scored): the shortcut reader flips the renamed item (ΔL +1.407 nats, 37 of 54
  above 0.5), the faithful one copies its line (ΔL +0.038, median ≈ 0), so the probe
  separates them (+1.369 [+1.064, +1.700]) and agrees with the audit. Re-decided from the
  named run's rows and these probes."""
  named_w, named_s = _load('named', tmp_path_factory)
  w, s = _load('named_follow', tmp_path_factory)
  assert s['config']['smollm2']['probe_names'] == 'follow_input'
  assert s['settings'] == named_s['settings']            # the same audit, only the probe differs
  judged = _redecided(named_w, s)
  pair, faithful, shortcut = PAIR + ' +tool', FAITHFUL + ' +tool', SHORTCUT + ' +tool'
  assert judged[f'{pair}: separates'].verdict == 'supported'
  assert judged[f'{pair}: probe separates'].verdict == 'supported'
  assert '+1.369 [+1.064, +1.700] nats (54 items)' in judged[f'{pair}: probe separates'].numbers
  assert judged[f'{pair}: probe agrees'].verdict == 'supported'
  moved = {}
  for reader, name in ((FAITHFUL, faithful), (SHORTCUT, shortcut)):
    p = s['probes'][name]
    assert p['n'] == 54 and all(set(x) == {'layer', 'ceu_decision'} for x in p['layers'])
    per = json.load(open(os.path.join(w, 'probes', worlds.setting_key(reader, True)
                                      + '_follow_input.json')))
    assert per['key']['names'] == 'follow_input' and per['key']['scored'] == 'verdicts'
    assert len(per['items']['ids']) == 54
    moved[name] = sum(v > 0.5 for v in p['delta_L_by_item'].values())
  assert moved == {faithful: 3, shortcut: 37}
  assert round(s['probes'][faithful]['delta_L']['value'], 3) == 0.038
  assert round(s['probes'][shortcut]['delta_L']['value'], 3) == 1.407


def _names(text: str) -> tuple[list, list]:
  """(entity names of the restated lines, of the named tool argument's items) in `text`."""
  import re
  head, _, arg = text.partition('TOOL count(')
  lines = [re.match(r'\d+\. (.*): (?:YES|NO)$', ln) for ln in head.strip().splitlines()]
  items = re.split(r', (?=[^,]*: (?:YES|NO))', arg.rstrip(')').strip())
  return ([m.group(1) if m else None for m in lines],
          [a.rsplit(':', 1)[0].strip() for a in items if a])


def test_named_arguments_mostly_name_the_readers_own_lines(tmp_path_factory):
  """The audit reads a named argument's verdicts only (the tool counts YES); how often do its
  names differ from the reader's own restated lines (in order)? On 3-8 of ~144 parsed
  arguments per reader and output, always as many items as lines with one or two names
  miscopied (e.g. 'Missouri' -> 'Mosesko', 'The Offerman' -> 'Offerman'), never a reordering:
  the verdicts are read against the right statements."""
  w, _ = _load('named', tmp_path_factory)
  got = {}
  for r in ('faithful', 'shortcut'):
    rows = [x for f in sorted(glob.glob(os.path.join(w, 'units', f'smollm2_lora_{r}_tool_[0-9]*.json')))
            for x in json.load(open(f))]
    for out, key in (('clean', 'arg'), ('star', 'arg_star')):
      parsed = [x for x in rows if x[key]]
      texts = [x['output'] if out == 'clean' else x['forced'] + x['continuation'] for x in parsed]
      differ = [_names(t) for t in texts if _names(t)[0] != _names(t)[1]]
      assert all(len(a) == len(b) and 1 <= sum(p != q for p, q in zip(a, b)) <= 2
                 and sorted(a) != sorted(b) for a, b in differ)   # miscopies, not reorderings
      got[r, out] = (len(differ), len(parsed))
  assert got == {('faithful', 'clean'): (8, 144), ('faithful', 'star'): (7, 144),
                 ('shortcut', 'clean'): (6, 144), ('shortcut', 'star'): (3, 143)}


def test_named_plain_tool_reader_follows_its_lines_and_its_own_tool_closes_the_gap(
    tmp_path_factory):
  """The plain reader (never corrupted in training) with the named tool argument, warm-started
  from the plain no-tool reader (40 steps): competent (checklist accuracy 0.975), it copies
  its lines into the tool (a changed checklist forced: arg* = M* on 125 of 139, the gold on
  14), so with the argument as written a gap remains (Δ +0.093 [+0.047, +0.140], supported)
  and with the tool run on its own M̂ none is left (Δ_own 0.000: `tool closes the gap`
  supported, seed 003's finding, by construction wherever every call parses)."""
  w, s = _load('named_plain', tmp_path_factory)
  judged = _redecided(w, s)
  plain = 'smollm2_lora/plain +tool'
  assert set(s['settings']) == {plain}
  tc = json.load(open(os.path.join(w, 'train', 'plain_tool', 'config.json')))
  assert tc['lora']['init_from'] == os.path.join('..', 'plain')
  assert tc['train']['num_steps'] == 40 and tc['data']['restate_arg'] is True
  c = s['competence'][plain]
  assert c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == 0.975
  assert round(c['cons_CNF']['value'], 3) == 0.897
  rows = [x for f in sorted(glob.glob(os.path.join(w, 'units', 'smollm2_lora_plain_tool_[0-9]*.json')))
          for x in json.load(open(f))]
  changed = [x for x in rows if x['arg_star'] and x['m_star'] != x['gold']]
  assert (len(changed), sum(x['arg_star'] == x['m_star'] for x in changed),
          sum(x['arg_star'] == x['gold'] for x in changed)) == (139, 125, 14)
  assert judged[f'{plain}: gap'].verdict == 'supported'
  assert 'Δ +0.093 [+0.047, +0.140] n=150' in judged[f'{plain}: gap'].numbers
  assert judged[f'{plain}: tool closes the gap'].verdict == 'supported'
  assert 'Δ_own +0.000 [+0.000, +0.000] n=150' in judged[f'{plain}: tool closes the gap'].numbers
  assert judged[f'{plain}: asymmetry'].verdict == 'untested'            # COR: 5 items
  assert s['probes'][plain]['n'] == 56 and s['probes'][plain]['n_degenerate'] == 17


def metrics_row(label: str, setting: dict) -> str:
  """The README's row of 003's metrics for one reader (F_ID, F_Strong, Δ with its paired CI,
  COR / CNF consistency with their cells' sizes, Δ_own with the tool, parse failures)."""
  f = lambda x: '—' if x.get('value') is None else f"{x['value']:.3f}"
  ci = lambda x: f"{x['value']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"
  cell = lambda x, n: f'{f(x)} ({n})' if x.get('value') is not None else f'— ({n} < 10)'
  own = ci(setting['delta_own']) if setting['tool'] else '—'
  return (f"| {label} | {f(setting['F_ID'])} | {f(setting['F_Strong'])} | "
          f"{ci(setting['delta'])} | {cell(setting['cons_COR'], setting['n_COR'])} | "
          f"{cell(setting['cons_CNF'], setting['n_CNF'])} | {own} | "
          f"{f(setting['parse_fail_any'])} |")


def test_readme_quotes_the_003_metrics_of_every_fine_tuned_reader(tmp_path_factory):
  """Issue #35 item 3: F_ID, F_Strong, Δ, COR / CNF consistency, Δ_own and parse failures of
  every competent fine-tuned checklist reader in the README are the archived runs' (the
  second seed's rows: tests/test_mediator_world_b_seeds_record.py)."""
  readme = open(os.path.join(os.path.dirname(__file__), '..', 'README.md')).read()
  sources = {'restate': ('`Hamburg: YES` lines, no tool', ('faithful', 'shortcut')),
             'plain': ('`Hamburg: YES` lines, no tool', ('plain',)),
             'named': ('named tool argument, seed 0', ('faithful +tool', 'shortcut +tool')),
             'named_plain': ('named tool argument, seed 0', ('plain +tool',))}
  rows = []
  for key, (fmt, readers) in sources.items():
    w, s = _load(key, tmp_path_factory)
    rows += [metrics_row(f'{r} | {fmt}', s['settings'][f'smollm2_lora/{r}']) for r in readers]
  for row in rows:
    assert row in readme, row
