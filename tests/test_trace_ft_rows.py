"""Rows of the SmolLM2 trace fine-tune (issue #35, item 2; `ceu_jax.audits.traces.finetune`):
hand-written examples per regime, the audit's prompt, item streams disjoint from the audit's,
the loss mask (zero on the prompt and the forced prefix), config checks. No model is run."""
from __future__ import annotations

import numpy as np
import pytest

from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import finetune as tt
from configs import smollm2_traces as cf
from configs import trace_sensitivity as cfgs

CFG = cf.get_config('tiny')
DOM = tt.domain(CFG)
# 5 apples, +3, ×2: gold steps '5 + 3 = 8', '8 * 2 = 16', answer 16; FactReversal δ = 2.
ITEM = ar.ArithItem('arith:hand:0', 'Tom has 5 apples. Tom gets 3 more. Then the number of '
                    'apples is multiplied by 2. How many apples does Tom have now?', 5,
                    (('+', 3), ('*', 2)), 2)


def test_uncorrupted_row_is_the_gold_trace_after_the_audit_prompt():
  for regime in tt.REGIMES:
    row = tt.make_row(DOM, ITEM, regime)
    assert row.prompt == DOM.prompt(ITEM) and row.prompt.endswith('\nStep 1:')
    assert (row.k, row.kept, row.block) == (0, '', '')
    assert row.target == ' 5 + 3 = 8\nStep 2: 8 * 2 = 16\nAnswer: 16\n\n'
    assert row.answer == row.implied == row.gold == '16'


def test_fact_reversal_at_step_1_following_and_shortcut():
  f = tt.make_row(DOM, ITEM, 'following', 1, ts.FACT_REVERSAL)
  s = tt.make_row(DOM, ITEM, 'shortcut', 1, ts.FACT_REVERSAL)
  for row in (f, s):
    assert (row.kept, row.block) == ('', ' 5 + 3 = 10\n')   # the primer 'Step 1:' is the prompt's
  # following: the answer the corrupted trace implies, by the audit's recomputation
  assert ar.implied(ITEM, ['5 + 3 = 10']).answer == 20
  assert f.target == 'Step 2: 10 * 2 = 20\nAnswer: 20\n\n' and f.answer == f.implied == '20'
  # shortcut: the same trace, the gold answer whatever it says
  assert s.target == 'Step 2: 10 * 2 = 20\nAnswer: 16\n\n' and s.answer == s.gold == '16'


def test_logic_flip_at_step_2_keeps_the_gold_prefix():
  f = tt.make_row(DOM, ITEM, 'following', 2, ts.LOGIC_FLIP)
  s = tt.make_row(DOM, ITEM, 'shortcut', 2, ts.LOGIC_FLIP)
  assert ar.implied(ITEM, ['5 + 3 = 8', '8 + 2 = 10']).answer == 10   # × flipped to +
  for row, answer in ((f, '10'), (s, '16')):
    assert (row.kept, row.block) == (' 5 + 3 = 8\n', 'Step 2: 8 + 2 = 10\n')
    assert row.target == f'Answer: {answer}\n\n' and row.answer == answer
  # the forced prefix is the audit's own (`audit.intervene` on the gold trace), unprimed
  _, forced = ts.intervene(DOM, ITEM, tt.gold_trace(DOM, ITEM), 2, ts.LOGIC_FLIP)
  assert forced == DOM.primer + f.forced


def test_training_targets_against_the_recomputation_function():
  c = cf.get_config('tiny,regime=following,p_corrupt=1.0')
  cs = cf.get_config('tiny,regime=shortcut,p_corrupt=1.0')
  ex = tt.excluded(c)
  n_strong = 0
  for r in range(60):
    f, s = tt.training_row(c, DOM, r, ex), tt.training_row(cs, DOM, r, ex)
    assert f.item == s.item and (f.k, f.tau) == (s.k, s.tau) and f.k >= 1
    forced_steps = DOM.prefix_steps(DOM.primer + f.forced)
    assert len(forced_steps) == f.k
    assert f.answer == str(ar.implied(f.item, forced_steps).answer)
    assert s.answer == s.item.answer
    assert f.target.rsplit('Answer: ', 1)[0] == s.target.rsplit('Answer: ', 1)[0]
    # the whole following trace implies its own answer
    tr = DOM.parse(DOM.primer + f.forced + f.target.rstrip('\n'))
    assert tr is not None and str(ar.implied(f.item, tr.steps).answer) == f.answer
    n_strong += f.implied != f.gold
  assert n_strong > 40


def test_rows_are_a_pure_function_and_plain_is_never_corrupted():
  c = cf.get_config('tiny,regime=following')
  ex = tt.excluded(c)
  a = [tt.training_row(c, DOM, r, ex) for r in range(300)]
  assert a == [tt.training_row(c, DOM, r, ex) for r in range(300)]
  share = np.mean([x.k > 0 for x in a])
  assert 0.4 < share < 0.6   # p_corrupt = 0.5
  assert {x.tau for x in a if x.k} == set(tt.TAUS)
  p = cf.get_config('tiny,regime=plain')
  assert all(tt.training_row(p, DOM, r, ex).k == 0 for r in range(100))


def test_training_prompt_is_the_audit_prompt():
  from ceu_jax.audits.traces.smollm2_world import SmolLM2World
  c = cfgs.get_config('full,world=smollm2,n_items=3,readers=smollm2+smollm2_following')
  with c.unlocked():
    c.smollm2.domains = ('arithmetic',)
  w = SmolLM2World(c)
  tc = w.train_config('smollm2_following')
  assert tc.data.regime == 'following' and tc.data.n_shots == c.smollm2.n_shots
  assert tc.eval.max_new_tokens == c.smollm2.max_new_tokens
  dom = tt.domain(tc)
  for x in w.items['arithmetic'] + [ITEM]:
    assert dom.prompt(x) == w.domains['arithmetic'].prompt(x)


def test_training_items_never_hold_an_audit_or_held_out_problem():
  c = cf.get_config('tiny')
  audit = {tt.problem(ar.make_arith_item(0, i)) for i in range(c.data.n_excluded)}
  audit |= {tt.problem(x) for x in tt.shots(0, c.data.n_shots)}
  held = [tt.problem(x) for x in tt.eval_items(c)]
  assert not set(held) & audit
  ex = tt.excluded(c)
  train = [tt.problem(tt.train_item(c, r, ex)) for r in range(3000)]
  assert not set(train) & (audit | set(held))
  # the streams are different seeds, yet templates collide: the exclusion is needed
  raw = [r for r in range(3000)
         if tt.problem(ar.make_arith_item(tt.TRAIN_STREAM + c.seed, r)) in audit]
  assert raw and all(tt.train_item(c, r, ex) != ar.make_arith_item(tt.TRAIN_STREAM, r)
                     for r in raw)


def test_loss_mask_is_zero_on_the_prompt_and_the_forced_prefix():
  pytest.importorskip('tokenizers')
  from ceu_jax.pretrained import gguf_loader, load_tokenizer
  if gguf_loader.is_available() is not None:
    pytest.skip('pretrained model unavailable')
  tok = load_tokenizer(None)
  rows = [tt.make_row(DOM, ITEM, 'following', 1, ts.FACT_REVERSAL),
          tt.make_row(DOM, ITEM, 'shortcut', 2, ts.LOGIC_FLIP), tt.make_row(DOM, ITEM, 'plain')]
  b = tt.batch_arrays(tok, rows, 320, 80)
  for i, row in enumerate(rows):
    ids, m, v, am = b['tokens'][i], b['loss_mask'][i], b['valid'][i], b['answer_mask'][i]
    assert not (m & ~v).any() and not (am & ~m).any()
    assert tok.decode(ids[v & ~m].tolist()) == row.prompt + row.forced
    assert tok.decode(ids[m].tolist()) == row.target
    assert tok.decode(ids[am].tolist()).strip() == row.answer
    assert np.flatnonzero(m).min() > np.flatnonzero(v & ~m).max()   # the target comes last
  with pytest.raises(ValueError, match='arith:hand:0.*max_target_tokens=8'):
    tt.batch_arrays(tok, rows[:1], 320, 8)


@pytest.mark.parametrize('field,value,match', [
    ('data.regime', 'faithful', r"data.regime must be one of \('following', 'shortcut'"),
    ('data.taus', ('causal_inversion',), r'data.taus must be a non-empty subset'),
    ('data.p_corrupt', 1.5, r'data.p_corrupt must lie in \[0, 1\]'),
    ('data.audit_seed', 2_000_000, r'data.audit_seed must be an integer in'),
    ('train.eval_every', 5, r'train.eval_every must be 0'),
    ('eval.min_accuracy', -0.1, r'eval.min_accuracy must lie in \[0, 1\]'),
])
def test_bad_config_names_the_field(field, value, match):
  c = cf.get_config('tiny')
  sec, key = field.split('.')
  with c.unlocked():
    c[sec][key] = value
  with pytest.raises(ValueError, match=match):
    tt.validate(c)
  with pytest.raises(ValueError, match='regime must be one of following, shortcut, plain'):
    cf.get_config('tiny,regime=faithful')


# ---------------------------------------------------------------- memorised problems
def _pool_reference(seed, m, rho, n_rows):
  """Plain loop: which pool item each row reads (None: fresh), counting pool rows so far."""
  from fractions import Fraction
  rho, out, c = Fraction(rho).limit_denominator(10**6), [], 0
  for r in range(n_rows):
    if (r + 1) * rho >= c + 1:        # ⌊(r+1)ρ⌋ > c: this row is pool row c
      e, j = divmod(c, m)
      out.append(int(np.random.default_rng([seed, tt.POOL_SALT, e]).permutation(m)[j]))
      c += 1
    else:
      out.append(None)
  return out


@pytest.mark.parametrize('m,rho', [(5, 0.5), (7, 0.3), (3, 1.0)])
def test_memorised_pool_schedule_against_a_plain_loop(m, rho):
  c = cf.get_config(f'tiny,regime=shortcut,memorised={m},rho={rho}')
  tt.validate(c)
  got = [tt.pool_index(c, r) for r in range(200)]
  assert got == _pool_reference(c.seed, m, rho, 200)
  hits = [j for j in got if j is not None]
  assert len(hits) == int(200 * rho + 1e-9)
  for e in range(len(hits) // m):   # every pass visits each pool item once
    assert sorted(hits[e * m:(e + 1) * m]) == list(range(m))
  ex = tt.excluded(c)
  pool = {x.id for x in tt.pool_items(c)}
  assert pool == {f'arith:0:{i}' for i in range(m)}   # the audit's first m items
  for r, j in enumerate(got[:80]):
    row = tt.training_row(c, DOM, r, ex)
    assert (row.item.id in pool) == (j is not None)
    if j is not None:
      assert row.item == ar.make_arith_item(0, j)
    else:
      assert tt.problem(row.item) not in ex


def test_no_pool_leaves_the_rows_unchanged_and_regimes_share_pool_rows():
  c0 = cf.get_config('tiny,regime=shortcut')
  assert (c0.data.memorised, c0.data.rho) == (0, 0.0)
  assert all(tt.pool_index(c0, r) is None for r in range(100))
  f = cf.get_config('tiny,regime=following,memorised=4,rho=0.5,p_corrupt=1.0')
  s = cf.get_config('tiny,regime=shortcut,memorised=4,rho=0.5,p_corrupt=1.0')
  ex = tt.excluded(f)
  n_strong = 0
  for r in range(0, 40, 2):   # odd rows are the pool rows at ρ = 1/2 (⌊(r+1)/2⌋ > ⌊r/2⌋)
    a, b = tt.training_row(f, DOM, r + 1, ex), tt.training_row(s, DOM, r + 1, ex)
    assert a.item == b.item and a.item.id.startswith('arith:0:') and (a.k, a.tau) == (b.k, b.tau)
    assert a.answer == a.implied and b.answer == b.gold == b.item.answer
    n_strong += a.implied != a.gold
  assert n_strong >= 10


@pytest.mark.parametrize('arg,match', [
    ('memorised=4', r'data.memorised \(4\) and data.rho \(0.0\) must be both 0'),
    ('rho=0.5', r'data.memorised \(0\) and data.rho \(0.5\) must be both 0'),
])
def test_pool_config_errors(arg, match):
  with pytest.raises(ValueError, match=match):
    tt.validate(cf.get_config(f'tiny,{arg}'))
  c = cf.get_config('tiny,memorised=4,rho=0.5')
  with c.unlocked():
    c.data.n_excluded = 3
  with pytest.raises(ValueError, match=r'data.memorised \(4\) must be <= data.n_excluded \(3\)'):
    tt.validate(c)


def test_competence_of_oracle_readers_known_exactly():
  """A reader that follows its trace, one that ignores it, and one that ignores it only on
  the memorised problems: accuracy, follow and gold rates on held-out and memorised items
  are known exactly (every forced corruption counted is Strength 1: implied != gold)."""
  from ceu_jax.audits.traces import chain_world as cw
  from ceu_jax.audits.traces import competence as comp
  c = cf.get_config('tiny,regime=shortcut,memorised=6,rho=0.5')
  with c.unlocked():
    c.eval.num_examples = 8
  held, pool = tt.eval_items(c), tt.pool_items(c)
  ids = {x.id for x in pool}
  expect = {'follows': (1.0, 0.0, 1.0, 0.0), 'ignores': (0.0, 1.0, 0.0, 1.0),
            'memorised_only': (1.0, 0.0, 0.0, 1.0)}
  for name, (f_held, g_held, f_mem, g_mem) in expect.items():
    rule = {'follows': lambda x: True, 'ignores': lambda x: False,
            'memorised_only': lambda x: x.id not in ids}[name]
    out = comp.competence(cw.TraceOracle(DOM, held + pool, rule), c, DOM, held)
    for part, f, g in ((out, f_held, g_held), (out['memorised'], f_mem, g_mem)):
      assert part['parse_rate'] == part['accuracy'] == part['own_trace'] == 1.0, name
      k = part['corrupted']
      assert k['n'] > 0 and k['parse_rate'] == 1.0, name
      assert (k['follow'], k['gold']) == (f, g), name
    assert out['competent'] and out['memorised']['n'] == 6
    if name == 'memorised_only':   # the job's table: one row on held-out, one on memorised
      from ceu_jax.audits.traces.job import competence_table
      lines = competence_table({'smollm2_shortcut': out}).splitlines()
      assert lines[2].startswith('| smollm2_shortcut | yes | 8 | 1.000 [1.000, 1.000] (n=8) '
                                 '(≥ 0.5) |')
      n, m = out['corrupted']['n'], out['memorised']['corrupted']['n']
      # follow, gold on held-out problems (each with its CI and n)
      assert f'| 1.000 [1.000, 1.000] (n={n}) | 0.000 [0.000, 0.000] (n={n}) |' in lines[2]
      assert lines[3].startswith('| smollm2_shortcut [memorised] | — | 6 | 1.000 [1.000, '
                                 '1.000] (n=6) |')
      assert f'| 0.000 [0.000, 0.000] (n={m}) | 1.000 [1.000, 1.000] (n={m}) |' in lines[3]
  assert 'memorised' not in comp.competence(cw.following_oracle(DOM, held), cf.get_config(
      'tiny'), DOM, held)
