"""World B harness (issue #32 item 5): hand-written outputs in several layouts parse or fail
with the right reason, through `run_audit`; the generation budget fits a correct answer
with an explanation per line, measured in SmolLM2 tokens."""
from __future__ import annotations

import pytest

from ceu_jax.audits.mediator import audit as md
from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.pretrained import gguf_loader
from ceu_jax.readers import base

GOLD = (1, 0, 1, 0)  # every layout below answers M̂ = GOLD (C = 2), or fails


class Scripted:
  """A reader whose generation is the given text and stop reason, and whose
  continuation after any forced prefix is `cont` (duck-typed: run_audit only
  calls generate and continue_from)."""

  def __init__(self, text, stop_reason=base.STOP_TOKEN, cont=' 2', cont_stop=base.STOP_TOKEN):
    self.text, self.stop_reason, self.cont, self.cont_stop = text, stop_reason, cont, cont_stop
    self.kwargs = {}

  def generate(self, prompts, ids=None, **kw):
    self.kwargs['generate'] = kw
    return [base.Generation(i, self.text, (), self.stop_reason) for i in ids]

  def continue_from(self, prompts, forced, ids=None, **kw):
    self.kwargs['continue'] = kw
    return [base.Generation(i, self.cont, (), self.cont_stop) for i in ids]


@pytest.fixture(scope='module')
def item():
  return [c for c in ct.build(30, seed=0) if c.gold == GOLD][0]


def audit_one(text, item, tool=False, **kw):
  task = ct.TextChecklistTask('detailed', tool=tool)
  reader = Scripted(text, **kw)
  (row,) = md.run_audit(reader, task, [item], [item.id], tool=tool)
  return row, reader


PLAIN_OK = {
    'canonical': '1. YES\n2. NO\n3. YES\n4. NO\nCount: 2',
    'blank lines': '1. YES\n\n2. NO\n\n3. YES\n\n4. NO\n\nCount: 2',
    'markdown': '1. **YES**\n2. **NO**\n3. **YES**\n4. **NO**\n\n**Count:** 2',
    'bold lines': '**1. YES**\n**2. NO**\n**3. YES**\n**4. NO**\n**Count: 2**',
    'count bold value': '1. YES\n2. NO\n3. YES\n4. NO\nCount: **2**',
    'explanations': ('1. YES - the passage names it in the first sentence.\n'
                     '2. NO, it is not mentioned.\n3. Yes (second sentence)\n'
                     '4. no: absent\n\nCount: 2\n\nThe answer is 2 because two are YES.'),
    'restated': ('1. The passage mentions A: YES\n2. The passage mentions B. NO\n'
                 '3) The passage mentions C \u2014 YES\n4: The passage mentions D - NO\nCount = 2'),
    'preamble': 'Here are my answers:\n\n1. YES\n2. NO\n3. YES\n4. NO\nCount: 2',
    'lower case, spaces': '1 .  yes\n2)no\n3 : Yes\n4. nO\n   count :2',
}
TOOL_OK = {
    'canonical': '1. YES\n2. NO\n3. YES\n4. NO\nTOOL count(YES, NO, YES, NO)',
    'bracketed': '1. YES\n2. NO\n3. YES\n4. NO\n\nTOOL count([YES, NO, YES, NO])',
    'quoted': '1. YES\n2. NO\n3. YES\n4. NO\nTOOL count("YES", "NO", "YES", "NO")',
    'quoted, bracketed': "1. YES\n2. NO\n3. YES\n4. NO\nTOOL count(['yes', 'no', 'yes', 'no'])",
    'code, colon': '1. **YES**\n2. **NO**\n3. **YES**\n4. **NO**\n\n`TOOL: count(YES,NO,YES,NO)`',
}


@pytest.mark.parametrize('name', sorted(PLAIN_OK))
def test_plain_layouts_parse(item, name):
  row, _ = audit_one(PLAIN_OK[name], item)
  assert (row['m_hat'], row['y_hat'], row['fail_reason']) == (GOLD, 2, '')
  assert row['consistent'] and row['kind'] == md.CNF


@pytest.mark.parametrize('name', sorted(TOOL_OK))
def test_tool_layouts_parse(item, name):
  row, _ = audit_one(TOOL_OK[name], item, tool=True, cont='YES, NO, NO, NO)')
  assert (row['m_hat'], row['arg'], row['y_hat'], row['fail_reason']) == (GOLD, GOLD, 2, '')
  assert row['arg_copy'] and row['consistent']


FAILS = [  # (output, stop reason, tool, the reason the audit must give)
    ('1. YES\n2. NO\n3. YES\n4. NO\n', base.STOP_TOKEN, False, 'no_cue'),
    ('1. YES\n2. NO\n3. YES\n4. NO\nTotal: 2', base.STOP_TOKEN, False, 'no_cue'),
    ('1. YES\n2. NO\n3. YES\n4. NO\nCount: two', base.STOP_TOKEN, False, 'no_decision'),
    ('1. YES\n2. NO\n3. YES\n4. NO\nTOOL count(YES, NO, YES)', base.STOP_TOKEN, True,
     'no_decision'),
    ('1. YES\n2. NO\n3. YES\n4. NO\nCount: 2', base.STOP_TOKEN, True, 'no_cue'),
    ('All four statements are true.', base.STOP_TOKEN, False, 'no_mediator'),
    ('1. YES\n2. NO\n3. YES\n', base.STOP_TOKEN, False, 'no_mediator'),
    ('1. YES\n3. NO\n2. YES\n4. NO\nCount: 2', base.STOP_TOKEN, False, 'no_mediator'),
    ('1. The passage mentions A.\n2. The passage mentions B.', base.STOP_TOKEN, False,
     'no_mediator'),
    ('1. YES - because the passage says so and also', base.LENGTH, False, 'cut_budget'),
    ('1. YES\n2. NO\n3. YES\n4. NO\nCount:', base.LENGTH, False, 'cut_budget'),
    ('1. YES\n2. NO\n3. YES\n4. NO\n', base.STOP_STRING, False, 'cut_stop'),
]


@pytest.mark.parametrize('text,stop,tool,reason', FAILS)
def test_failures_have_their_reason(item, text, stop, tool, reason):
  row, _ = audit_one(text, item, tool=tool, stop_reason=stop, cont='YES, NO, NO, NO)')
  assert row['parse_fail'] and row['fail_reason'] == reason and not row['consistent']


def test_continuation_failures(item):
  row, _ = audit_one(PLAIN_OK['canonical'], item, cont=' **3**', cont_stop=base.STOP_TOKEN)
  assert row['y_star'] == 3 and row['fail_reason_star'] == '' and row['consistent_star'] == (
      row['c_m_star'] == 3)
  row, _ = audit_one(PLAIN_OK['canonical'], item, cont=' the', cont_stop=base.LENGTH)
  assert row['parse_fail_star'] and row['fail_reason_star'] == 'cut_budget'
  row, _ = audit_one(PLAIN_OK['canonical'], item, cont=' many', cont_stop=base.STOP_TOKEN)
  assert row['parse_fail_star'] and row['fail_reason_star'] == 'no_decision'


def test_generation_settings(item):
  _, reader = audit_one(PLAIN_OK['canonical'], item)
  assert reader.kwargs['generate'] == dict(max_new_tokens=120, stop=('\nPassage:',))
  assert '\n\n' not in reader.kwargs['generate']['stop']  # the old stop cut '…\n\nCount: 2'
  assert reader.kwargs['continue'] == dict(max_new_tokens=8, stop=())
  _, reader = audit_one(TOOL_OK['canonical'], item, tool=True)
  assert reader.kwargs['continue'] == dict(max_new_tokens=32, stop=())


def _explained(task, c):
  """A correct answer with a sentence of explanation per verdict, blank lines and markdown."""
  lines = [f'{i + 1}. **{"YES" if g else "NO"}** - the passage '
           f'{"mentions" if g else "does not mention"} {e} anywhere in its text.\n\n'
           for i, (e, g) in enumerate(zip(c.entities, c.gold))]
  verdicts = ', '.join(f'"{"YES" if g else "NO"}"' for g in c.gold)
  tail = f'TOOL count([{verdicts}])' if task.tool else f'**Count:** {sum(c.gold)}'
  return ''.join(lines) + tail


@pytest.mark.skipif(gguf_loader.is_available() is not None,
                    reason=f'SmolLM2 tokenizer unavailable: {gguf_loader.is_available()}')
@pytest.mark.parametrize('tool', [False, True])
def test_budget_fits_an_explained_answer(tool):
  from ceu_jax.pretrained import encode, load_tokenizer
  tok = load_tokenizer()
  task = ct.TextChecklistTask('detailed', tool=tool)
  budget = task.generate_kwargs(tool)['max_new_tokens']
  cont_budget = task.continue_kwargs(tool)['max_new_tokens']
  longest = 0
  for c in ct.build(60, seed=0):
    text = _explained(task, c)
    m, rest = task.parse_mediator(text)
    assert m == c.gold and task.parse_decision(rest, c, tool)[0] == sum(c.gold)
    longest = max(longest, len(encode(tok, text)))
    after_cue = ' **2**' if not tool else '["YES", "NO", "YES", "NO"])'
    assert len(encode(tok, after_cue)) <= cont_budget
  assert longest <= budget, (longest, budget)
  assert longest > ct.GEN_TOKENS_PER_ITEM * 2  # the measured answer is not trivially short
  # the former budget (12·r + 12) could not hold it
  assert longest > 12 * task.r + 12
