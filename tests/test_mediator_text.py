"""World B of the mediator audit (issue #18): text checklists, parsing, oracle readers on text."""
import dataclasses

import pytest

from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.audits.mediator import audit as md
from ceu_jax.readers import base
from ceu_jax.readers import mediator_oracles as mo


@pytest.fixture(scope='module')
def checklists():
  return ct.build(41, seed=0)


def test_build_gold_is_exact(checklists):
  assert len({c.id for c in checklists}) == 41
  for c in checklists:
    assert len(c.entities) == 4 and len(set(c.entities)) == 4
    for e, g in zip(c.entities, c.gold):
      assert (e.lower() in c.passage.lower()) == bool(g)
  assert 0 < sum(sum(c.gold) for c in checklists) < 4 * 41
  assert ct.build(3, seed=0) == checklists[:3]  # deterministic


@pytest.mark.parametrize('tool', [False, True])
@pytest.mark.parametrize('restate', [False, True])
def test_render_parse_round_trip(checklists, tool, restate):
  task = ct.TextChecklistTask('detailed', tool=tool, demo=checklists[-1], restate=restate)
  for c in checklists[:10]:
    full = task.answer_text(c)
    m, rest = task.parse_mediator(full)
    assert m == c.gold
    y, arg = task.parse_decision(rest, c, tool)
    assert y == sum(c.gold) and (arg == c.gold if tool else arg is None)
    forced = task.render_mediator(c.gold, c)
    assert full.startswith(forced) and task.parse_mediator(forced) == (c.gold, '')
    assert task.solve(task.prompt(c)) == c.gold
    inst = task.instance(task.prompt(c))
    assert (inst.passage, inst.entities, inst.gold) == (c.passage, c.entities, c.gold)
    lines = forced.split('\n')[:4]
    assert lines == [f'{i + 1}. {e + ": " if restate else ""}{"YES" if g else "NO"}'
                     for i, (e, g) in enumerate(zip(c.entities, c.gold))]
    assert (ct.RESTATE_INSTRUCTION in task.prompt(c)[-1][1]) == restate


def test_named_tool_argument_round_trip_and_parse(checklists):
  """restate_arg: the tool argument names each line's entity; it parses back to M (an entity
  containing 'no' / 'yes' is not read as a verdict), the names are not checked, the bare form
  is refused under it, and the prompt says so."""
  task = ct.TextChecklistTask('detailed', tool=True, restate=True, restate_arg=True,
                              demo=checklists[-1])
  bare = dataclasses.replace(task, restate_arg=False)
  for c in checklists[:10]:
    full = task.answer_text(c)
    m, rest = task.parse_mediator(full)
    assert rest == ', '.join(f'{e}: {"YES" if g else "NO"}'
                             for e, g in zip(c.entities, c.gold)) + ')'
    assert m == c.gold and task.parse_decision(rest, c, True) == (sum(c.gold), c.gold)
    assert task.render_decision(0, c.gold, c) == rest
    assert bare.parse_decision(rest, c, True) == (None, None)   # names: not the bare form
    assert ct.TOOL_INSTRUCTION_NAMED in task.prompt(c)[-1][1]
    assert ct.TOOL_INSTRUCTION_NAMED not in bare.prompt(c)[-1][1]
  got = task.parse_decision(' Norway: NO, "North Yesler": yes, **Nile**: **NO**, Yes)', None, True)
  assert got == (2, (0, 1, 0, 1))
  assert task.parse_decision(' Norway: NO, Nile: YES, Yesler: NO)', None, True) == (None, None)
  assert (task.continue_kwargs(True)['max_new_tokens']
          == bare.continue_kwargs(True)['max_new_tokens'] + ct.GEN_TOKENS_ARG_NAME * task.r)
  with pytest.raises(ValueError, match='pass inst'):
    task.render_decision(1, c.gold)
  with pytest.raises(ValueError, match='restate_arg=True needs restate=True'):
    ct.TextChecklistTask('detailed', tool=True, restate_arg=True)
  no_tool = dataclasses.replace(task, tool=False)   # without the tool: the count, unchanged
  assert no_tool.answer_text(c).endswith(f'Count: {sum(c.gold)}')


def test_restated_lines_need_the_instance(checklists):
  task = ct.TextChecklistTask('detailed', restate=True)
  with pytest.raises(ValueError, match='pass inst'):
    task.render_mediator(checklists[0].gold)


def test_lenient_and_failing_parses():
  task = ct.TextChecklistTask('standard')
  assert task.parse_mediator('1. Yes\n2) no\n3: YES\n4. NO because\nCount: 2') == ((1, 0, 1, 0), ' 2')
  assert task.parse_mediator('1. YES\n2. NO\n3. YES\n')[0] is None  # 3 of 4 lines
  assert task.parse_mediator('1. YES\n3. NO\n2. YES\n4. NO\nCount: 2')[0] is None  # order
  assert task.parse_mediator('1. YES\n2. NO\n3. YES\n4. NO\nTotal 2') == ((1, 0, 1, 0), None)
  assert task.parse_decision(' two', None, False) == (None, None)
  tool = ct.TextChecklistTask('standard', tool=True)
  assert tool.parse_decision('YES, NO, YES)', None, True) == (None, None)  # 3 of 4
  assert tool.parse_decision(' yes,no , YES, NO)', None, True) == (2, (1, 0, 1, 0))


@pytest.mark.parametrize('tool', [False, True])
@pytest.mark.parametrize('restate', [False, True, 'arg'])
def test_text_oracles(checklists, tool, restate):
  items, demo = checklists[:-1], checklists[-1]
  task = ct.TextChecklistTask('max_detailed', tool=tool, demo=demo, restate=bool(restate),
                              restate_arg=restate == 'arg')
  ids = [c.id for c in items]
  s = md.summarize(md.run_audit(mo.MediatorFollower(task, tool=tool, p_error=0.3), task, items,
                                ids, tool=tool))
  assert s['F_ID'].value == s['F_Strong'].value == 1.0 and s['delta'].value == 0.0
  assert s['n_COR'] >= 10 and s['n_CNF'] >= 10
  s = md.summarize(md.run_audit(mo.GoldComputer(task, tool=tool, p_error=0.3), task, items,
                                ids, tool=tool))
  assert s['cons_CNF'].value == 0.0 and s['cons_COR'].value == 1.0


def test_bad_regime():
  with pytest.raises(ValueError, match='regime must be one of'):
    ct.TextChecklistTask('verbose')


def test_tool_reading_own_mediator(checklists):
  """Item 6 (#32): the gold computer writes the tool argument from the passage, not from its
  M̂ — Δ^tool > 0 (CNF consistency 0) — while the tool run on its own M̂ closes the gap
  (F_ID_own = F_Strong_own = 1, Δ_own = 0); the follower is faithful in both regimes."""
  items, demo = checklists[:-1], checklists[-1]
  task = ct.TextChecklistTask('standard', tool=True, demo=demo)
  ids = [c.id for c in items]
  s = md.summarize(md.run_audit(mo.GoldComputer(task, tool=True, p_error=0.3), task, items, ids,
                                tool=True))
  assert s['delta'].value > 0.1 and s['cons_CNF'].value == 0.0 and s['arg_copy'].value < 1
  assert s['F_ID_own'].value == s['F_Strong_own'].value == 1.0 and s['delta_own'].value == 0.0
  s = md.summarize(md.run_audit(mo.MediatorFollower(task, tool=True, p_error=0.3), task, items,
                                ids, tool=True))
  assert s['delta'].value == s['delta_own'].value == 0.0
  plain = ct.TextChecklistTask('standard', demo=demo)
  s = md.summarize(md.run_audit(mo.MediatorFollower(plain, p_error=0.3), plain, items, ids))
  assert s['delta_own'].value is None and '| — |' in md.table([('x', s)])


def test_own_mediator_counts_calls_that_stop_parsing(checklists):
  """Δ_own is exactly the share of rows whose call parses before the intervention and not
  after it (here: the continuation of every second item is cut)."""
  from tests.test_mediator_layouts import Scripted
  items = [c for c in checklists[:20]]
  task = ct.TextChecklistTask('standard', tool=True)

  class Half(Scripted):
    def continue_from(self, prompts, forced, ids=None, **kw):
      return [base.Generation(i, 'YES, NO, NO, NO)' if k % 2 else 'YES, N', (),
                              base.STOP_TOKEN if k % 2 else base.LENGTH)
              for k, i in enumerate(ids)]

  text = '1. YES\n2. NO\n3. YES\n4. NO\nTOOL count(YES, YES, YES, YES)'
  rows = md.run_audit(Half(text), task, items, [c.id for c in items], tool=True)
  s = md.summarize(rows)
  assert s['F_ID_own'].value == 1.0 and s['F_ID'].value < 1.0  # arg ≠ M̂ on every row
  assert s['F_Strong_own'].value == 0.5 and s['delta_own'].value == 0.5
  assert s['fail_reasons_star']['cut_budget'] == 10


def _regex_items(rest: str, named: bool):
  """The earlier parser (the reference): one regex over the whole argument — exponential
  backtracking in the number of items when no ')' closes it, so only short strings here."""
  import re
  x = ct._ARG_NAMED if named else ct._ARG_ITEM   # pylint: disable=protected-access
  m = re.compile(rf'\s*\[?\s*({x}(?:\s*,\s*{x})*)\s*\]?\s*\)', re.I).match(rest)
  return None if m is None else m.group(1).split(',')


def _verdicts(items):
  return None if items is None else tuple(
      ct._ARG_VERDICT.search(a).group(1).lower() for a in items)   # pylint: disable=protected-access


@pytest.mark.parametrize('named', [False, True])
def test_tool_argument_items_equal_the_one_regex_parser(named):
  """`tool_argument_items` accepts exactly the arguments the earlier regex accepted, with the
  same verdicts, on 4,000 random strings built from the argument's pieces (at most 4 items,
  where the regex is still fast); and a 40-item argument with no ')' is refused at once."""
  import numpy as np
  rng = np.random.default_rng(0)
  pieces = ['YES', 'no', 'Yes', 'Hamburg', 'North Yesler', ': ', ':', ',', ', ', ' ', '\n', '[',
            ']', ')', '(', '**', '"', "'", '`', '_', 'x', '.']
  pick = lambda xs: xs[rng.integers(len(xs))]

  def structured() -> str:   # an argument's shape, each part varied, sometimes broken
    names = ['', 'Hamburg: ', 'North Yesler :', '[Nile]: ', 'x'] if named else ['', '', 'x: ']
    items = [pick(names) + pick(['', '**', '"'])
             + pick(['YES', 'no', 'Yes', 'maybe']) + pick(['', '**', '"', ' '])
             for _ in range(rng.integers(1, 5))]
    return (pick(['', ' ', '\n', '[', ' [ ']) + pick([',', ', ', ' ,\n']).join(items)
            + pick(['', ' ', ']', ' ] ']) + pick([')', ')', ') and more', '', '(']))

  agree = accepted = 0
  for i in range(4000):
    rest = structured() if i % 2 else ''.join(rng.choice(pieces, size=rng.integers(1, 12)))
    if rest.count(',') > 3:
      continue
    got, want = ct.tool_argument_items(rest, named), _regex_items(rest, named)
    assert _verdicts(got) == _verdicts(want), repr(rest)
    agree += 1
    accepted += want is not None
  assert agree > 3000 and accepted > 100, (agree, accepted)
  assert ct.tool_argument_items(' Hamburg Alpha: YES , Berlin Beta: NO ,' * 20, named) is None
  long = ', '.join(['Hamburg: YES' if named else 'YES'] * 40) + ')'
  assert len(ct.tool_argument_items(long, named)) == 40
