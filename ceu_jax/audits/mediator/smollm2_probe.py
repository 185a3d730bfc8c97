"""SPEC §8.4 companion of the mediator audit on SmolLM2 (World B, issue #35 item 3): the
decision-position probe with M held fixed, as a layer profile at the read ports.

For a checklist X (passage, statements about entities e_1..e_r, gold M, C = the number of
YES) read by one World B setting (a prompted or fine-tuned reader, with or without the tool):
  D+  = the setting's prompt for X, then the gold M's lines and the cue teacher-forced, then
        the gold decision y (' C(M)', or the tool's argument), scored (an argument that names
        its entities, restate_arg: its verdicts scored, the names forced and not scored —
        a name is a copy, not the decision);
  D−  = the same with one false statement's entity e_j (gold NO) replaced by an entity of
        the passage that no statement names (`swapped`): X' has gold M' with line j YES, so
        C(M') = C(M) + 1 and the tool argument differs, while the forced M still leads to y.
        The first false statement with a same-token-count replacement is used (D+ and D−
        token-aligned; an item without one is skipped, counted by reason);
  ΔL  = log p(y | D+) − log p(y | D−): the direct X → Y path that bypasses M (≈ 0 for a
        faithful reader, whose decision is C of the M it wrote; large for a shortcut one);
  CEU_decision(ℓ) = restoration by patching layer ℓ's read port at the decision positions,
        D+ → D−; CEU_input(ℓ) = the same for the part of that read that comes from the
        user message (passage, statements, instructions; Π_S).
The profile, summary, table and figure: `ceu_jax.audits.layer_probe`.

Names (`smollm2.probe_names`): a restating reader's lines name their statements' entities
(`1. Hamburg: NO`). 'verbatim' keeps D+'s forced output in D−, so D−'s line j still names
e_j although D−'s statement j is about the swapped entity; 'follow_input' writes D−'s line j
with the swapped entity and D+'s verdict (M's verdicts held fixed, its names following the
input): D± then differ in the output too, outside the user message, so only the whole-read
probe (CEU_decision) is defined there, and ΔL includes any path through the written names.
For a reader that does not restate, both give the same pairs. Under restate_arg the tool
argument's names follow the input as the lines do (D−'s item j names the swapped entity, D+'s
verdict); they are forced and not scored in either mode (`_encode`), so D± may differ there.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from ceu_jax.audits import layer_probe
from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.audits.mediator import finetune

DESCRIPTION = (
    'World B checklists, each setting: D+ = the prompt, the gold checklist M and the cue '
    'teacher-forced, the gold decision y scored (a tool argument naming its entities: its '
    'verdicts, the names forced); D− = the same with one false statement\'s '
    'entity replaced by one the passage mentions (the checklist now has one more YES, the '
    'forced M — verbatim, entities named as in D+ for a restating reader — still leads to y). ΔL = log p(y | D+) − log p(y | D−): the direct X → Y path '
    'that bypasses M (≈ 0 for a faithful reader). CEU_decision(ℓ) = restoration by patching '
    'layer ℓ\'s read port (attention read) at the decision positions only, D+ → D−; '
    'CEU_input(ℓ) = the same for the part of that read that comes from the user message '
    '(Π_S). CEU over non-degenerate items (ΔL ≥ ε); 95% bootstrap CIs over items.')
PROBES = ('decision', 'input')   # the whole read / its part read from the user message
TITLES = ('CEU_decision: the read at the decision', 'CEU_input: its part read from the input')
NAMES = ('verbatim', 'follow_input')   # smollm2.probe_names (module doc)
FOLLOW_NOTE = (' Names follow the input (smollm2.probe_names = follow_input): D−\'s restated '
               'line j (and a named tool argument\'s item j) names the swapped entity with '
               'D+\'s verdict, so D± also differ in the '
               'forced output and only CEU_decision is defined; ΔL includes any path through '
               'the written names.')


def probes_of(names: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(probe names, panel titles) under smollm2.probe_names `names`."""
  if names not in NAMES:
    raise ValueError(f'smollm2.probe_names must be one of {NAMES}, got {names!r}')
  return (PROBES, TITLES) if names == 'verbatim' else (PROBES[:1], TITLES[:1])


def _encode(tok, task: ct.TextChecklistTask, template, c: ct.Checklist, m, decision: str,
            shown: Optional[ct.Checklist] = None, y_names: Optional[Sequence[str]] = None):
  """(ids, decision token count, user-message flags over ids, scored decision tokens or
  None) of prompt + M + cue + y; M is rendered as the reader writes it for checklist `shown`
  (default c: a restating reader names shown's entities, so D− keeps D+'s forced output
  verbatim). Under restate_arg the argument's names (`Hamburg:`, y_names, default shown's)
  are flagged unscored."""
  from ceu_jax.pretrained.tokenizer import encode
  text = finetune.prompt_text(task, template, c)
  head = tok.encode(text, add_special_tokens=False)
  target = task.render_mediator(m, c if shown is None else shown) + decision
  enc = tok.encode(target, add_special_tokens=False)
  lo = len(target) - len(decision)
  flags = [b > lo for _, b in enc.offsets]
  n_dec = len(flags) - flags.index(True)
  if task.named_arg:   # the names of the tool argument (`Hamburg:`) are forced, not scored
    names, pos = [], lo
    for e in y_names or (c if shown is None else shown).entities:
      a = target.index(f'{e}:', pos)
      names.append((a, a + len(e) + 1))
      pos = a + len(e) + 1
    scored = tuple(not any(a0 < e1 and b0 > s for s, e1 in names)   # touches no name
                   for a0, b0 in enc.offsets[len(flags) - n_dec:])
  else:
    scored = None
  user = task._user(c)   # pylint: disable=protected-access
  u0 = text.rindex(user)
  span = tuple(a < u0 + len(user) and b > u0 for a, b in head.offsets) + (False,) * len(enc.ids)
  if encode(tok, text) != list(head.ids):
    raise AssertionError('token ids and offsets disagree')
  return list(head.ids) + list(enc.ids), n_dec, span, scored


def swapped(c: ct.Checklist, j: int, entity: str) -> ct.Checklist:
  """X' = c with statement j about `entity` (mentioned by the passage: gold YES)."""
  ents = list(c.entities)
  ents[j] = entity
  gold = list(c.gold)
  gold[j] = 1
  return dataclasses.replace(c, entities=tuple(ents), gold=tuple(gold))


def probe_pairs(tok, task: ct.TextChecklistTask, template, checklists: Sequence[ct.Checklist],
                names: str = 'verbatim') -> tuple[list[layer_probe.ProbePair], dict]:
  """The checklists' (D+, D−) pairs, and {id: reason} of those skipped ('all_true': no
  false statement; 'no_aligned_swap': no replacement that keeps D± token-aligned, the
  prompt and the forced output each)."""
  probes_of(names)
  follow = names == 'follow_input'
  out, skipped = [], {}
  for c in checklists:
    gold = tuple(int(x) for x in c.gold)
    y = task.render_decision(task.decide(gold), tool_arg=gold if task.tool else None, inst=c)
    plus, n_dec, span, scored = _encode(tok, task, template, c, gold, y)
    false = [j for j, g in enumerate(gold) if not g]
    if not false:
      skipped[c.id] = 'all_true'
      continue
    cands = [e for e in ct.entities(c.passage) if e not in c.entities]
    pair = None
    for j in false:
      for e in cands:
        x = swapped(c, j, e)
        y_minus, y_names = y, c.entities
        if follow and task.named_arg:   # the argument's names follow the input too
          y_minus = task.render_decision(task.decide(gold), tool_arg=gold, inst=x)
          y_names = x.entities
        minus, _, span_minus, scored_minus = _encode(
            tok, task, template, x, gold, y_minus, shown=None if follow else c,
            y_names=y_names)
        if len(minus) != len(plus) or (follow and span_minus != span) or (
            scored_minus != scored):
          continue   # (the user-message flags locate the prompt's end: both parts aligned)
        pair = layer_probe.ProbePair(c.id, tuple(plus), tuple(minus), n_dec,
                                     (None,) if follow else (None, span), scored)
        if pair.problem():   # e.g. a renamed argument item whose name ends in the verdict's token
          pair = None
          continue
        break
      if pair is not None:
        break
    if pair is None:
      skipped[c.id] = 'no_aligned_swap'
      continue
    out.append(pair)
  return out, skipped


def table(probes, names: str = 'verbatim') -> str:
  return layer_probe.table(probes, probes_of(names)[0], unit='checklists')


def layer_figure(probes, stem: str, names: str = 'verbatim') -> list[str]:
  held = 'M held fixed' if names == 'verbatim' else 'M\'s verdicts held fixed, names follow X'
  return layer_probe.layer_figure(
      probes, *probes_of(names), stem,
      f'§8.4 decision-position probe, {held}, one statement made true (95% CI)\n'
      'y scored; a tool argument\'s names (when it names them) forced, not scored')
