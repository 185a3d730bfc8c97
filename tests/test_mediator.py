"""Mediator audit (SPEC §8.3, issue #18): oracle readers, invariants, bad input, World A data."""
import dataclasses
import random

import numpy as np
import pytest

from ceu_jax.audits.mediator import audit as md
from ceu_jax.audits.mediator.checklist_world import ChecklistTask
from ceu_jax.data import checklist
from ceu_jax.data.checklist import ChecklistConfig
from ceu_jax.readers import base
from ceu_jax.readers import mediator_oracles as mo

N = 160


@pytest.fixture(scope='module')
def world():
  task = ChecklistTask(ChecklistConfig())
  xs = task.instances(N, seed=3)
  return task, xs, [f'x{i}' for i in range(N)]


@pytest.mark.parametrize('tool', [False, True])
def test_follower_is_faithful(world, tool):
  task, xs, ids = world
  task = task.with_tool(tool)
  rows = md.run_audit(mo.MediatorFollower(task, tool=tool, p_error=0.2, p_swap=0.2), task, xs,
                      ids, tool=tool)
  s = md.summarize(rows)
  assert s['F_ID'].value == 1.0 and s['F_Strong'].value == 1.0
  assert s['delta'].value == 0.0 and s['delta'].ci_low == 0.0 and s['delta'].ci_high == 0.0
  assert s['n_COR'] >= 10 and s['n_CNF'] >= 10
  assert s['cons_COR'].value == 1.0 and s['cons_CNF'].value == 1.0
  assert s['parse_fail_any'].value == 0.0
  if tool:  # the argument is a copy of the M in its output
    assert all(tuple(r['arg_star']) == tuple(r['m_star']) for r in rows)


@pytest.mark.parametrize('tool', [False, True])
def test_gold_computer_ignores_its_mediator(world, tool):
  task, xs, ids = world
  task = task.with_tool(tool)
  reader = mo.GoldComputer(task, tool=tool, p_error=0.2, p_swap=0.25)
  rows = md.run_audit(reader, task, xs, ids, tool=tool)
  s = md.summarize(rows)
  assert s['cons_CNF'].value == 0.0 and s['cons_COR'].value == 1.0
  # independent count: items whose M̂ (recomputed from the oracle's own error
  # draw) differs from the gold but has the same count
  expect = 0
  for x, i in zip(xs, ids):
    m_hat = mo._with_errors(x.gold, i, 0.2, 0.25, mo.ERROR_SEED)
    expect += m_hat != x.gold and sum(m_hat) == sum(x.gold)
  assert expect > 0
  assert s['F_Strong'].value == pytest.approx(expect / N, abs=1e-12)
  assert s['F_Strong'].value < s['F_ID'].value


@pytest.mark.parametrize('const_m,const_y', [((1, 0, 1), 2), ((0, 0, 0), 0), ((1, 1, 0), 3)])
def test_constant_reader_closed_form(world, const_m, const_y):
  task, xs, ids = world
  rows = md.run_audit(mo.ConstantReader(task, const_m, const_y), task, xs, ids)
  s = md.summarize(rows)
  f_id = float(sum(const_m) == const_y)
  # COR where gold ≠ const_m: consistent after iff C(gold) = const_y; CNF: C(M*) ≠ C(const_m)
  post = [float(sum(x.gold) == const_y) if x.gold != const_m else float(sum(const_m) != const_y)
          for x in xs]
  n_cor = sum(x.gold != const_m for x in xs)
  assert s['n_COR'] == n_cor and s['n_CNF'] == N - n_cor
  assert s['F_ID'].value == f_id
  assert s['F_Strong'].value == pytest.approx(f_id * np.mean(post), abs=1e-12)
  cor = [p for p, x in zip(post, xs) if x.gold != const_m]
  assert s['cons_COR'].value == pytest.approx(np.mean(cor), abs=1e-12)


def test_invariants_and_order_independence(world):
  task, xs, ids = world
  reader = mo.GoldComputer(task, p_error=0.3)
  rows = md.run_audit(reader, task, xs, ids)
  for r, x in zip(rows, xs):
    assert r['strong'] <= r['consistent']
    if r['kind'] == md.CNF:
      assert r['m_hat'] == x.gold and sum(r['m_star']) != sum(r['m_hat'])
      assert sum(a != b for a, b in zip(r['m_star'], r['m_hat'])) == 1  # minimal
    else:
      assert r['m_hat'] != x.gold and r['m_star'] == x.gold
  order = list(range(N))
  random.Random(0).shuffle(order)
  again = md.run_audit(reader, task, [xs[k] for k in order], [ids[k] for k in order])
  by_id = {r['id']: r for r in again}
  assert all(by_id[r['id']]['m_star'] == r['m_star'] for r in rows)
  bad = [dict(r) for r in rows]
  k = next(i for i, r in enumerate(bad) if r['kind'] == md.CNF)
  bad[k]['m_star'] = bad[k]['m_hat']
  with pytest.raises(AssertionError, match='leaves C unchanged'):
    md.check_rows(task, xs, bad)


class _Recording(base.Reader):
  """Wraps a reader, recording every forced prefix it receives."""

  def __init__(self, inner):
    self.inner, self.forced = inner, {}

  def _generate(self, prompts, forced, budget, stops, ids):
    if forced is not None:
      self.forced.update({i: f for i, f in zip(ids, forced)})
    return self.inner._generate(prompts, forced, budget, stops, ids)

  def _loglik(self, prompts, answers, ids):
    return self.inner._loglik(prompts, answers, ids)


def test_forced_prefix_is_byte_identical(world):
  task, xs, ids = world
  rec = _Recording(mo.MediatorFollower(task, p_error=0.3))
  rows = md.run_audit(rec, task, xs, ids)
  for r in rows:
    expect = tuple(task.vocab.yes if v else task.vocab.no for v in r['m_star'])
    assert rec.forced[r['id']] == expect == r['forced']
    assert task.parse_mediator(rec.forced[r['id']])[0] == r['m_star']


def test_tool_forced_prefix_ends_at_the_cue(world):
  """SPEC §8.3: M* forced 'ending at the decision cue' — with the tool, M* then TOOL; the
  continuation is the argument alone (r tokens), parsed as the decision."""
  _, xs, ids = world
  task = ChecklistTask(ChecklistConfig(tool=True))
  v, m = task.vocab, (1, 0, 1)
  assert task.render_mediator(m) == task.mediator_tokens(m) + (v.tool,)
  assert task.parse_mediator(task.render_mediator(m)) == (m, ())
  full = task.render_mediator(m) + task.render_decision(None, m)  # the training layout
  assert full == checklist.render_answer(task.cfg, m, m)
  assert task.parse_decision(task.parse_mediator(full)[1], None, True) == (2, m)
  assert task.parse_decision(task.mediator_tokens(m), None, True) == (2, m)  # after the cue
  assert task.parse_mediator(task.mediator_tokens(m) + task.mediator_tokens(m))[1] is None
  assert task.continue_kwargs(True)['max_new_tokens'] == task.r
  rec = _Recording(mo.MediatorFollower(task, tool=True, p_error=0.3))
  rows = md.run_audit(rec, task, xs, ids, tool=True)
  for r in rows:
    assert rec.forced[r['id']] == task.mediator_tokens(r['m_star']) + (v.tool,) == r['forced']
    assert r['continuation'] == task.mediator_tokens(r['m_star'])  # the argument, no cue
  s = md.summarize(rows)
  assert s['n_COR'] >= 10 and s['n_CNF'] >= 10
  assert s['F_Strong'].value == s['F_ID'].value == 1.0 and s['parse_fail_star'].value == 0.0
  plain = task.with_tool(False)  # plain mode unchanged: M* alone, one count token after it
  assert plain.render_mediator(m) == plain.mediator_tokens(m)
  assert plain.continue_kwargs(False)['max_new_tokens'] == 1
  same = lambda x: (x.query, x.context, x.gold)  # the same items in both modes
  assert list(map(same, plain.instances(4, seed=3))) == list(map(same, task.instances(4, seed=3)))
  with pytest.raises(ValueError, match='with_tool'):  # an audit in the other mode is refused
    md.run_audit(rec, plain, xs[:2], ids[:2], tool=True)


class _Garble(base.Reader):
  """Wraps a reader; on ids in `bad_m` the output's first token is not YES / NO,
  on ids in `bad_y` the decision token after a forced prefix is garbage."""

  def __init__(self, inner, bad_m, bad_y, junk):
    self.inner, self.bad_m, self.bad_y, self.junk = inner, set(bad_m), set(bad_y), junk

  def _generate(self, prompts, forced, budget, stops, ids):
    out = self.inner._generate(prompts, forced, budget, stops, ids)
    hit = self.bad_m if forced is None else self.bad_y
    return [dataclasses.replace(g, tokens=(self.junk,) + g.tokens[1:]) if g.id in hit else g
            for g in out]

  def _loglik(self, prompts, answers, ids):
    return self.inner._loglik(prompts, answers, ids)


@pytest.mark.parametrize('tool', [False, True])
def test_unparseable_outputs_count_as_inconsistent(world, tool):
  task, xs, ids = world
  task = task.with_tool(tool)
  junk = task.vocab.tok('NOTE')
  bad_m, bad_y = ids[:16], ids[10:30]
  reader = _Garble(mo.MediatorFollower(task, tool=tool), bad_m, bad_y, junk)
  rows = md.run_audit(reader, task, xs, ids, tool=tool)
  s = md.summarize(rows)
  by = {r['id']: r for r in rows}
  assert all(by[i]['parse_fail'] and not by[i]['consistent'] for i in bad_m)
  assert all(by[i]['kind'] == md.COR for i in bad_m)  # unparseable M̂ ≠ gold
  assert all(by[i]['parse_fail_star'] and not by[i]['strong'] for i in bad_y)
  assert s['parse_fail'].value == pytest.approx(16 / N)
  assert s['parse_fail_star'].value == pytest.approx(20 / N)
  assert s['parse_fail_any'].value == pytest.approx(30 / N)
  assert s['F_ID'].value == pytest.approx(1 - 16 / N)
  assert s['F_Strong'].value == pytest.approx(1 - 30 / N)


@dataclasses.dataclass(frozen=True)
class _FrozenC(ChecklistTask):
  """C reads X: on instances whose first claim is about an even KEY, C is constant 0."""

  def decide(self, m, inst=None):
    if inst is not None and inst.query[4] % 2 == 0:
      return 0
    return sum(m)


def test_uneditable_mediator_is_skipped_with_reason(world):
  _, xs, ids = world
  task = _FrozenC(ChecklistConfig())
  rows = md.run_audit(mo.ConstantReader(task, (0, 0, 0), 0), task, xs, ids)
  frozen = [x.query[4] % 2 == 0 and x.gold == (0, 0, 0) for x in xs]
  assert sum(frozen) > 0
  s = md.summarize(rows)
  assert s['skipped'] == {'no_edit_changes_C': sum(frozen)}
  assert s['n_audited'] == N - sum(frozen)
  for r, f in zip(rows, frozen):
    assert (r['kind'] == md.SKIP) == f


def test_small_cells_are_absent(world):
  task, xs, ids = world
  rows = md.run_audit(mo.MediatorFollower(task, p_error=0.02), task, xs[:40], ids[:40])
  s = md.summarize(rows)
  assert s['n_COR'] < 10 and s['cons_COR'].value is None and s['cons_COR'].n == 0
  assert s['cons_CNF'].value == 1.0
  assert md.summarize([])['F_ID'].value is None


def test_cnf_edit_is_minimal_and_seeded():
  task = ChecklistTask(ChecklistConfig())
  a = md.cnf_edit(task, (1, 0, 1), None, 'id7')
  assert a == md.cnf_edit(task, (1, 0, 1), None, 'id7')
  assert sum(x != y for x, y in zip(a, (1, 0, 1))) == 1
  stars = {md.cnf_edit(task, (1, 0, 1), None, f'id{i}') for i in range(40)}
  assert len(stars) == 3  # every single flip changes the count; all are drawn


# ------------------------------------------------------------- World A data
@pytest.mark.parametrize('claims', checklist.CLAIMS)
def test_checklist_data_gold_and_regimes(claims):
  n = 400
  for regime in checklist.REGIMES:
    for tool in (False, True):
      cfg = ChecklistConfig(regime=regime, tool=tool, claims=claims)
      task = ChecklistTask(cfg)
      v = cfg.vocab
      corrupted = 0
      for i in range(n):
        x = checklist.example(cfg, 0, 'train', 0, i)
        assert task.solve(task.prompt(x)) == x.gold
        assert len(x.answer) == cfg.answer_len and len(x.query) == cfg.query_len
        assert len(x.context) == cfg.context_len
        m_forced = tuple(int(t == v.yes) for t in x.answer[:cfg.r])
        corrupted += m_forced != x.gold
        assert sum(a != b for a, b in zip(m_forced, x.gold)) <= 1
        rest = x.answer[cfg.r:]
        target = (tuple(int(t == v.yes) for t in rest[1:]) if tool
                  else v.count_of(rest[0]))
        want_m = m_forced if regime == 'faithful' else x.gold
        assert target == (want_m if tool else sum(want_m))
        test = checklist.example(cfg, 0, 'test', 0, i)  # test answers: always gold
        assert tuple(int(t == v.yes) for t in test.answer[:cfg.r]) == test.gold
      if regime == 'plain':
        assert corrupted == 0
      else:  # p_corrupt = 0.3 per example: 120 expected of 400, sd ≈ 9
        assert 80 < corrupted < 160


@pytest.mark.parametrize('claims', checklist.CLAIMS)
def test_checklist_batch_and_corruption(claims):
  import jax
  cfg = ChecklistConfig(regime='faithful', claims=claims)
  b = checklist.generate_batch(cfg, 0, 2, 8, 'train')
  assert b.query.shape == (8, cfg.query_len) and b.answer.shape == (8, cfg.answer_len)
  assert int(b.evidence_mask.sum()) == 8 * cfg.r * checklist.LINE_LEN
  assert int(b.value_mask.sum()) == 8 * cfg.r
  assert int(b.query.max()) < cfg.vocab.size and int(b.answer.max()) < cfg.vocab.size
  again = checklist.generate_batch(cfg, 0, 2, 8, 'train')
  assert np.array_equal(np.asarray(b.context), np.asarray(again.context))
  minus = checklist.corrupt(cfg, b, 'value_swap', jax.random.PRNGKey(1))
  changed = np.asarray(minus.context) != np.asarray(b.context)
  assert np.array_equal(changed, np.asarray(b.value_mask))
  if claims == 'verdict':  # every claim's truth flips under value_swap
    task = ChecklistTask(cfg)
    from ceu_jax.readers.atr import prompts_from_batch
    for p, m in zip(prompts_from_batch(b), prompts_from_batch(minus)):
      assert all(x != y for x, y in zip(task.solve(p), task.solve(m)))


@pytest.mark.parametrize('field,value,msg', [
    ('r', 0, 'data.r must be an integer'), ('regime', 'lazy', 'data.regime must be one of'),
    ('p_corrupt', 1.5, r'data.p_corrupt must be in \[0, 1\]'),
    ('lines_per_passage', 0, 'data.lines_per_passage')])
def test_checklist_config_errors(field, value, msg):
  with pytest.raises(ValueError, match=msg):
    ChecklistConfig(**{field: value})
