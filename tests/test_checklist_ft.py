"""Checklist readers for the mediator audit's World B (issue #35, item 1): SmolLM2 fine-tuned
(LoRA) in World A's regimes. The rows' targets are known exactly (faithful: C of the flipped
checklist, shortcut: C of the gold, plain: never flipped; tool: the argument) and parse back
under the audit's own rules; the audit's checklists are never trained on; the prompt is
tokenised as the reader tokenises it; the tiny fine-tune trains once, writes its competence
check and is reused on rerun."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.audits.mediator import finetune as F
from ceu_jax.pretrained import gguf_loader
from configs import smollm2_checklist as C
from tests.test_train_helpers import metric_rows, remove_units

_WHY = gguf_loader.is_available()
needs_model = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')


def test_config_errors_name_the_field():
  F.validate(C.get_config('tiny'))
  for field, value, msg in (('regime', 'honest', 'data.regime'),
                            ('p_corrupt', 2.0, r'data.p_corrupt must lie in \[0, 1\]'),
                            ('r', 0, 'data.r'), ('n_shots', 2, 'data.n_shots'),
                            ('max_target_tokens', 400, 'data.max_target_tokens must be <')):
    c = C.get_config('tiny')
    with c.unlocked():
      c.data[field] = value
    with pytest.raises(ValueError, match=msg):
      F.validate(c)
  with pytest.raises(ValueError, match='regime'):
    C.get_config('tiny,regime=honest')
  c = C.get_config('tiny,tool=true')
  c.data.restate, c.data.restate_arg = False, True
  with pytest.raises(ValueError, match='data.restate_arg=True needs data.restate=True'):
    F.validate(c)


def test_check_fit_names_the_field_the_longest_row_and_the_length_needed():
  enc = [([1] * 5, 2, []), ([1] * 9, 4, []), ([1] * 7, 3, [])]
  F.sft.check_fit(enc, 9, 4, ['a', 'b', 'c'])                        # everything fits
  with pytest.raises(ValueError, match=r'^data.max_len=6 is too short for the 3 training rows: '
                     r'2 of them have a longer row \(the longest: 9 tokens, item b\); '
                     r'data.max_len must be >= 9$'):
    F.sft.check_fit(enc, 6, 4, ['a', 'b', 'c'])
  with pytest.raises(ValueError, match=r'^data.max_target_tokens=3 .* 1 of them has a longer '
                     r'target \(the longest: 4 tokens, item b\); data.max_target_tokens must be >= 4$'):
    F.sft.check_fit(enc, 9, 3, ['a', 'b', 'c'])


def test_line_accuracy_by_hand():
  """Lines right over all gold lines (an unparsed or short M̂ counts every line wrong) and
  the constant answer's share, on rows whose answers are known."""
  from ceu_jax.audits.mediator import competence
  rows = [dict(gold='1011', m_hat='1001'),      # 3 right (the audit's rows: M as a string)
          dict(gold='0010', m_hat='0010'),      # 4 right
          dict(gold='1110', m_hat=None),        # unparsed: 0
          dict(gold='0111', m_hat='011')]       # wrong length: 0
  out = competence.line_accuracy(rows)
  assert out == dict(n_lines=16, line_accuracy=7 / 16, line_constant=10 / 16)  # ten 1s of 16
  as_ints = [dict(gold=tuple(map(int, r['gold'])), m_hat=r['m_hat'] and tuple(map(int, r['m_hat'])))
             for r in rows]
  assert competence.line_accuracy(as_ints) == out
  assert competence.line_accuracy([dict(gold='00', m_hat='00')])['line_constant'] == 1.0
  assert competence.line_accuracy([dict(gold='0001', m_hat='0000')]) == dict(
      n_lines=4, line_accuracy=0.75, line_constant=0.75)


def test_competence_rates_carry_bootstrap_cis():
  """SPEC §8: every competence rate with its percentile bootstrap 95% CI (1000 resamples,
  seed 42) over the n checklists, in competence.json and in the report's table; the gate
  stays on the point values."""
  import ml_collections
  import numpy as np
  from ceu_jax.audits.mediator import audit as md
  from ceu_jax.audits.mediator import checklist_text as ct
  from ceu_jax.audits.mediator import competence
  from ceu_jax.metrics.resampling import mean_ci
  from ceu_jax.readers import mediator_oracles as mo
  items = ct.build(40, seed=0)
  task = ct.TextChecklistTask('standard', tool=False)
  cfg = ml_collections.ConfigDict(dict(eval=dict(min_accuracy=0.6, min_parse_rate=0.8)))
  reader = mo.MediatorFollower(task, p_error=0.35)
  c = competence.competence(reader, cfg, task, items)
  rows = md.run_audit(reader, task, items, [x.id for x in items])
  right = [float(r['m_hat'] == r['gold']) for r in rows]
  assert c['checklist_accuracy'] == np.mean(right) and 0.6 <= c['checklist_accuracy'] < 1
  assert set(c['ci']) == set(competence.CI_RATES)
  for k in competence.CI_RATES:
    a = c['ci'][k]
    assert a['n'] == 40 and a['value'] == pytest.approx(c[k], abs=1e-12)
    assert a['ci_low'] <= a['value'] <= a['ci_high']
  assert c['ci']['checklist_accuracy'] == mean_ci(np.asarray(right), seed=42).to_dict()
  assert c['ci']['checklist_accuracy']['ci_low'] < 0.6 < c['ci']['checklist_accuracy']['ci_high']
  assert c['competent']   # the gate: point values against the thresholds, not the CI
  lo, hi = c['ci']['checklist_accuracy']['ci_low'], c['ci']['checklist_accuracy']['ci_high']
  assert f"{c['checklist_accuracy']:.3f} [{lo:.3f}, {hi:.3f}]" in competence.table({'s': c})
  assert f'[{lo:.3f}, {hi:.3f}]' in competence.fmt_competence('s', c)
  old = {k: v for k, v in c.items() if k != 'ci'}   # a check recorded before the CIs
  assert 'no CI' in competence.table({'s': old}) and 'no CI' in competence.fmt_competence('s', old)


def test_items_never_include_the_audits_checklists():
  c = C.get_config('cpu')
  plan = F.audit_plan(c)
  held, pool = F.own_items(c, plan)
  from configs import mediator
  m = mediator.get_config('full,world=smollm2')
  again = ct.build(m.n_items + 1, r=m.smollm2.r, seed=m.seed,
                   max_words=m.smollm2.max_passage_words)
  assert [x.id for x in plan] == [x.id for x in again]   # World B's plan, as its world builds it
  ids = [x.id for x in plan]
  assert len(held) == 40 and len(pool) == 2000
  assert not set(ids) & {x.id for x in held + pool}
  assert not {x.id for x in held} & {x.id for x in pool}
  assert [x.id for x in F.own_items(c, plan)[1][:5]] == [x.id for x in pool[:5]]  # deterministic


@pytest.mark.parametrize('tool', [False, True, 'named'])
def test_row_targets_known_exactly_and_parse_back(tool):
  n = 400
  for regime in F.REGIMES:
    c = C.get_config(f'cpu,regime={regime},tool={str(bool(tool)).lower()}')
    c.data.restate_arg = tool == 'named'
    task = F.text_task(c, None)
    assert task.restate_arg == (tool == 'named')
    pool = [ct.Checklist(f'p{i}', 'x', ('A', 'B', 'C', 'D'), g) for i, g in enumerate(
        [(0, 1, 1, 0), (1, 1, 1, 1), (0, 0, 0, 0), (1, 0, 0, 1)])]
    flipped = 0
    for r in range(n):
      row = F.training_row(c, task, pool, r)
      gold = row.checklist.gold
      if regime == 'plain':
        assert row.flipped == -1 and row.m_forced == gold
      if row.flipped >= 0:
        flipped += 1
        assert sum(a != b for a, b in zip(row.m_forced, gold)) == 1
        assert row.m_forced[row.flipped] != gold[row.flipped]
      else:
        assert row.m_forced == gold
      src = row.m_forced if regime == 'faithful' else gold
      m, rest = task.parse_mediator(row.target)   # the audit's own parser
      y, arg = task.parse_decision(rest, None, bool(tool))
      assert m == row.m_forced and y == sum(src)
      assert arg == (src if tool else None)
      if tool == 'named':   # the argument names the checklist's entities
        assert rest == ', '.join(f'{e}: {"YES" if x else "NO"}'
                                 for e, x in zip(row.checklist.entities, src)) + ')'
    if regime != 'plain':
      assert 0.22 < flipped / n < 0.38   # p_corrupt 0.3 (seeded draws)


@needs_model
def test_row_tokens_are_the_readers_prompt_then_the_target():
  from ceu_jax.pretrained import load_tokenizer
  from ceu_jax.readers.chat import ChatTemplate, gguf_chat_template
  from ceu_jax.readers.smollm2 import SmolLM2Reader
  tok = load_tokenizer(None)
  tmpl = ChatTemplate.from_template(gguf_chat_template(None))
  reader = SmolLM2Reader.from_pretrained(n_layers=2, chat=True)
  c = C.get_config('cpu,regime=faithful,tool=true')
  plan = F.audit_plan(c)
  task = F.text_task(c, plan[-1])
  held, pool = F.own_items(c, plan)
  for r in (0, 1, 2, 3, 7):
    row = F.training_row(c, task, pool, r)
    ids, n_t, flags = F.row_tokens(tok, task, tmpl, row)
    head = reader.prompt_ids(task.prompt(row.checklist))
    assert ids[:len(head)] == head and len(ids) == len(head) + n_t
    assert tok.decode(ids[len(head):], skip_special_tokens=False) == row.target + '<|im_end|>'
    got = tok.decode([i for i, f in zip(ids[len(head):], flags) if f])
    assert got.strip() == row.decision.strip()
  batch = F.sft.pack([F.row_tokens(tok, task, tmpl, F.training_row(c, task, pool, r))
                      for r in range(4)], 384, 48, ['a', 'b', 'c', 'd'])
  assert batch['tokens'].shape == (4, 384) and batch['loss_mask'].sum(1).min() > 8


@needs_model
@pytest.mark.parametrize('tool', [False, True])
def test_every_training_row_of_the_mediator_recipe_fits_before_training(tool):
  """The mediator job's `:full` recipe with and without the tool: all 480 training rows fit
  (checked by the task's validate, as the training loop calls it); with one token less than
  the longest row the run is refused naming the field and the length needed. (The tool
  readers had inherited the no-tool length, 384, and stopped at step 20 of 120.)"""
  from ceu_jax.audits.mediator import worlds
  from ceu_jax.pretrained import load_tokenizer
  from configs import mediator
  tok = load_tokenizer(None)
  m = mediator.get_config(f'full,world=smollm2,finetuned=faithful,tools={"on" if tool else "off"}')
  tc = worlds.SmolLM2World(m).train_config('smollm2_lora/faithful', tool)
  assert F.row_len(tc) == ((416, 'data.max_len_tool') if tool else (384, 'data.max_len'))
  task = F.SmolLM2ChecklistTask.from_config(tc, load=lambda: (None, {'params': {}}, tok))
  task.validate(tc)
  rows = task.train_rows(0, int(tc.train.num_steps) * int(tc.train.batch_size))
  longest = max(len(task.encode(r)[0]) for r in rows)
  assert len(rows) == 480 and longest <= F.row_len(tc)[0]
  field = 'max_len_tool' if tool else 'max_len'
  with tc.unlocked():
    tc.data[field] = longest - 1
  with pytest.raises(ValueError, match=rf'data.{field}={longest - 1} is too short for the 480 '
                     rf'training rows: 1 of them has a longer row \(the longest: {longest} '
                     rf'tokens, item .+\); data.{field} must be >= {longest}'):
    task.validate(tc)


@needs_model
def test_tiny_world_b_audits_the_fine_tuned_readers_after_their_competence_check(tmp_path):
  """`:tiny,world=smollm2,finetuned=faithful+shortcut,tools=on`: both checklist readers
  trained (3 steps, 2 layers: plumbing) in W/train/<regime>_tool, checked (competence.run:
  W/train/<regime>_tool/competence.json, its numbers in [0, 1] and the competence rule),
  audited on World B's checklists beside the prompted model, the pair's `separates` claim
  drawn, a non-competent reader's claims untested; a rerun trains and checks nothing."""
  from ceu_jax import workdir as workdir_lib
  from ceu_jax.audits.mediator import job as mediator_job
  from configs import mediator as mediator_config
  c = mediator_config.get_config('tiny,world=smollm2,n_items=2,finetuned=faithful+shortcut,'
                                 'tools=on')
  w = str(tmp_path / 'w')
  logs: list = []
  s = mediator_job.run_mediator(c, w, log=logs.append)
  ft = ('smollm2_lora/faithful +tool', 'smollm2_lora/shortcut +tool')
  assert set(s['settings']) == {'smollm2/detailed +tool', *ft}
  assert sum('training smollm2_' in m for m in logs) == 2
  for k in ft:
    assert s['settings'][k]['n'] == 2
  assert tuple(s['competence']) == ft
  for regime in ('faithful', 'shortcut'):
    sub = os.path.join(w, 'train', f'{regime}_tool')
    assert workdir_lib.run_info(sub)['completed']
    tc = json.load(open(os.path.join(sub, 'config.json')))
    assert tc['data']['regime'] == regime and tc['data']['tool'] is True
    assert tc['data']['audit_n_items'] == 2 and tc['model']['n_layers'] == 2
    comp = json.load(open(os.path.join(sub, 'competence.json')))
    assert comp == s['competence'][f'smollm2_lora/{regime} +tool'] and comp['n'] == 2
    for k in ('checklist_accuracy', 'decision_parse_rate', 'line_accuracy', 'line_constant'):
      assert 0.0 <= comp[k] <= 1.0
    assert comp['competent'] == (comp['checklist_accuracy'] >= 0.5
                                 and comp['decision_parse_rate'] >= 0.8)
    assert any(f'smollm2_{regime} +tool' in m and 'held-out checklists' in m for m in logs)
    assert [r['step'] for r in metric_rows(sub, 'train')] == [1, 2, 3]
  names = {x['name']: x for x in s['claims']}
  sep = names['smollm2_lora/shortcut vs faithful +tool: separates']
  for x in s['claims']:
    bad = [k for k in ft if x['name'].startswith(k + ':') or x['name'] == sep['name']]
    if any(not s['competence'][k]['competent'] for k in bad):
      assert x['verdict'] == 'untested' and 'not competent' in x['numbers']
  report = open(os.path.join(w, 'report.md')).read()
  assert '## Competence before the audit' in report and '| smollm2_lora/shortcut +tool |' in report
  # §8.4: the decision-position probe of every setting, its claims, table and plot
  assert set(s['probes']) == set(s['settings'])
  for k, p in s['probes'].items():
    assert p['n'] + len(p['skipped']) == 2 and len(p['layers']) == 2
    assert os.path.exists(os.path.join(w, 'probes', k.replace('/', '_').replace(' +', '_')
                                       + '.json'))
  for what in ('probe separates', 'probe agrees'):
    assert f'smollm2_lora/shortcut vs faithful +tool: {what}' in names
  assert '## §8.4 companion: decision-position probe' in report
  assert os.path.exists(os.path.join(w, 'probe_layers.png'))
  # The fine-tuned readers' units only (the prompted model's is kept: it trains nothing):
  # their readers are built again, from the saved adapters, with no training or check.
  from ceu_jax.audits.mediator import worlds
  remove_units(w, tuple(worlds.setting_key(f'smollm2_lora/{r}', True) + '_'
                        for r in ('faithful', 'shortcut')), expect=2)
  os.remove(os.path.join(w, 'summary.json'))
  logs.clear()
  s2 = mediator_job.run_mediator(c, w, log=logs.append)
  assert not any('training' in m or '§8.4 probe' in m for m in logs), logs
  assert s2['settings'] == s['settings'] and s2['competence'] == s['competence']
  assert s2['probes'] == s['probes']
  # smollm2.probe_names, a free field: resumed under follow_input, only the probes are
  # computed again (cached apart from the verbatim ones, which stay); no unit, no training
  with c.unlocked():
    c.smollm2.probe_names = 'follow_input'
  logs.clear()
  s3 = mediator_job.run_mediator(c, w, log=logs.append)
  assert not any('training' in m or '] unit ' in m for m in logs), logs
  assert sum('§8.4 probe:' in m for m in logs) == 3
  assert s3['settings'] == s['settings'] and set(s3['probes']) == set(s['probes'])
  for k, p in s3['probes'].items():
    stem = os.path.join(w, 'probes', k.replace('/', '_').replace(' +', '_'))
    assert os.path.exists(stem + '.json') and os.path.exists(stem + '_follow_input.json')
    assert all(set(x) == {'layer', 'ceu_decision'} for x in p['layers'])
  assert 'Names follow the input' in open(os.path.join(w, 'report.md')).read()


@needs_model
def test_decision_probe_pairs_make_one_false_statement_true():
  """The mediator probe's D− swaps one false statement's entity for one the passage
  mentions (token-aligned): the gold count rises by one, the forced M and the scored
  decision (D+'s gold) are the same, and D± differ inside the user message only."""
  from ceu_jax.audits.mediator import smollm2_probe as mp
  from ceu_jax.pretrained import load_tokenizer
  from ceu_jax.readers.chat import ChatTemplate, gguf_chat_template
  tok = load_tokenizer(None)
  tmpl = ChatTemplate.from_template(gguf_chat_template(None))
  c = C.get_config('cpu')
  plan = F.audit_plan(c)
  for tool in (False, True):
    with c.unlocked():
      c.data.tool = tool
    task = F.text_task(c, plan[-1])
    pairs, skipped = mp.probe_pairs(tok, task, tmpl, plan[:24])
    assert len(pairs) + len(skipped) == 24 and len(pairs) >= 18
    assert set(skipped.values()) <= {'all_true', 'no_aligned_swap'}
    for p in pairs:
      p.check()   # aligned, differ only inside the user message
      x = next(x for x in plan if x.id == p.id)
      y = task.render_decision(sum(x.gold), tool_arg=tuple(x.gold) if tool else None)
      assert tok.decode(list(p.plus[-p.answer_len:])).strip() == y.strip()
      d = [k for k, (a, b) in enumerate(zip(p.plus, p.minus)) if a != b]
      new = tok.decode([p.minus[k] for k in range(d[0], d[-1] + 1)]).strip()
      j = [k for k, g in enumerate(x.gold) if not g]
      assert any(new in ct.entities(x.passage) or new in e for e in ct.entities(x.passage))
      assert any(tok.decode([p.plus[k] for k in range(d[0], d[-1] + 1)]).strip()
                 in x.entities[i] for i in j)
    for k, why in skipped.items():
      assert (why == 'all_true') == all(next(x for x in plan if x.id == k).gold)


@needs_model
def test_named_argument_probe_scores_the_verdicts_and_equals_the_engine(fast_compiled):
  # compile-bound: most XLA optimisations off (2026-11-30: 18 -> 11 s)
  """restate_arg: the probe's decision is the argument 'Hamburg: YES, …)'; its names are
  forced, not scored (a name is a copy, not the decision): the scored tokens decode to the
  verdicts, separators and ')' exactly, in D+ and D− alike. The batched fast path with this
  gapped answer mask equals `patching.reference_audit` of each pair alone (2 layers)."""
  import jax.numpy as jnp
  from ceu_jax import engine
  from ceu_jax.audits import layer_probe
  from ceu_jax.audits.mediator import smollm2_probe as mp
  from ceu_jax.pretrained import load_smollm2, load_tokenizer
  from ceu_jax.pretrained.patching import answer_positions, reference_audit
  from ceu_jax.readers.chat import ChatTemplate, gguf_chat_template
  tok = load_tokenizer(None)
  tmpl = ChatTemplate.from_template(gguf_chat_template(None))
  c = C.get_config('cpu,tool=true')
  c.data.restate_arg = True
  plan = F.audit_plan(c)
  task = F.text_task(c, plan[-1])
  for names in ('verbatim', 'follow_input'):
    pairs, skipped = mp.probe_pairs(tok, task, tmpl, plan[:12], names)
    assert len(pairs) >= 8
    for p in pairs:
      p.check()
      x = next(x for x in plan if x.id == p.id)
      tail = p.plus[-p.answer_len:]
      assert tok.decode(list(tail)).strip() == task.render_decision(0, x.gold, x).strip()
      got = tok.decode([t for t, s in zip(tail, p.scored) if s]).replace(' ', '')
      assert got == ','.join('YES' if g else 'NO' for g in x.gold) + ')'
      assert not all(p.scored)
      minus = tok.decode(list(p.minus[-p.answer_len:])).strip().rstrip(')')
      if names == 'verbatim':   # D−'s argument names D+'s entities
        assert p.minus[-p.answer_len:] == tail
      else:                     # ... or, following the input, the swapped one (D+'s verdicts)
        j = [k for k, (a, b) in enumerate(zip(minus.split(', '), tok.decode(list(tail)).strip()
                                                  .rstrip(')').split(', '))) if a != b]
        assert len(j) == 1 and x.gold[j[0]] == 0 and minus.split(', ')[j[0]].endswith(': NO')
        assert minus.split(', ')[j[0]][:-4] in ct.entities(x.passage)
  mc, variables = load_smollm2(None, n_layers=2)
  pairs = pairs[:3]
  got = layer_probe.per_item(variables['params'], mc, pairs, mp.PROBES[:1], batch_size=2)
  for i, p in enumerate(pairs):
    n = len(p.plus)
    mask = np.zeros((1, n), bool)
    mask[0, n - p.answer_len:] = p.scored
    inp = lambda ids: {'tokens': np.asarray([ids], np.int32), 'valid': np.ones((1, n), bool),
                       'answer_mask': mask}
    clean, corrupt = inp(p.plus), inp(p.minus)
    pos = np.asarray(answer_positions(clean['answer_mask']))[None]
    probes = engine.Probes(span=jnp.ones((1, 1, n - 1), bool), positions=jnp.asarray(pos),
                           names=mp.PROBES[:1])
    ref = reference_audit(variables, mc, clean=clean, corrupt=corrupt, probes=probes,
                          n_tail=p.answer_len)
    r0 = ref.results[0]
    np.testing.assert_allclose(got['L_plus'][i], float(r0.L_plus[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got['L_minus'][i], float(r0.L_minus[0]), rtol=1e-5, atol=1e-5)
    for layer, res in enumerate(ref.results):
      np.testing.assert_allclose(got['L_int']['decision'][layer][i],
                                 float(res.L_int_of('decision')[0]), rtol=1e-5, atol=1e-5)


@needs_model
def test_probe_names_follow_input_differ_in_the_restated_line_only():
  """smollm2.probe_names = follow_input: D−'s forced output names the swapped entity in line
  j with D+'s verdict (NO), so D± differ in the user message and in line j's name, nowhere
  else (prompt and output each token-aligned); the same swap as the verbatim pair where both
  exist; only the whole-read probe. A reader that does not restate gets the verbatim pairs."""
  from ceu_jax.audits.mediator import smollm2_probe as mp
  from ceu_jax.pretrained import load_tokenizer
  from ceu_jax.readers.chat import ChatTemplate, gguf_chat_template
  tok = load_tokenizer(None)
  tmpl = ChatTemplate.from_template(gguf_chat_template(None))
  c = C.get_config('cpu')
  assert c.data.restate
  plan = F.audit_plan(c)
  task = F.text_task(c, plan[-1])
  follow, skipped = mp.probe_pairs(tok, task, tmpl, plan[:24], 'follow_input')
  verbatim = {p.id: p for p in mp.probe_pairs(tok, task, tmpl, plan[:24])[0]}
  assert len(follow) + len(skipped) == 24 and len(follow) >= 16
  for p in follow:
    p.check()
    assert p.spans == (None,)
    x = next(x for x in plan if x.id == p.id)
    head = len(tok.encode(F.prompt_text(task, tmpl, x), add_special_tokens=False).ids)
    d = [k for k, (a, b) in enumerate(zip(p.plus, p.minus)) if a != b]
    inside, out = [k for k in d if k < head], [k for k in d if k >= head]
    assert inside and out                      # the statement and the restated line
    new = tok.decode([p.minus[k] for k in range(out[0], out[-1] + 1)]).strip()
    old = tok.decode([p.plus[k] for k in range(out[0], out[-1] + 1)]).strip()
    assert new in ct.entities(x.passage) and any(old in e for e in x.entities)
    lines = [tok.decode(list(q[head:-p.answer_len])).splitlines() for q in (p.plus, p.minus)]
    changed = [k for k, (a, b) in enumerate(zip(*lines)) if a != b]
    assert len(lines[0]) == len(lines[1]) and len(changed) == 1   # one line, verdict kept
    k = changed[0]
    assert (lines[0][k], lines[1][k]) == (f'{k + 1}. {x.entities[k]}: NO', f'{k + 1}. {new}: NO')
    if p.id in verbatim:   # the verbatim pair differs in the statement only, the same way
      v = verbatim[p.id]
      assert v.minus[:head] == p.minus[:head] and v.plus == p.plus
  with pytest.raises(ValueError, match='smollm2.probe_names must be one of'):
    mp.probe_pairs(tok, task, tmpl, plan[:2], 'names')
  with c.unlocked():
    c.data.restate = False
  plain = F.text_task(c, plan[-1])
  a, b = mp.probe_pairs(tok, plain, tmpl, plan[:8], 'follow_input')[0], mp.probe_pairs(
      tok, plain, tmpl, plan[:8])[0]
  assert [(p.plus, p.minus) for p in a] == [(p.plus, p.minus) for p in b]


def test_bad_probe_names_is_refused_naming_the_field():
  from ceu_jax.audits.mediator import worlds
  from configs import mediator as mediator_config
  c = mediator_config.get_config('tiny,world=smollm2,finetuned=faithful')
  assert c.smollm2.probe_names == 'verbatim'
  with c.unlocked():
    c.smollm2.probe_names = 'follow'
  with pytest.raises(ValueError, match=r"smollm2.probe_names must be one of \('verbatim', "
                                       r"'follow_input'\), got 'follow'"):
    worlds.make_world(c)
