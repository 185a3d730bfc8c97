"""SPEC §8.4 companion of the trace audit on SmolLM2 (World B, issue #35 item 3): the
answer-position probe with the trace held fixed, as a layer profile at the read ports.

For an arithmetic item X (start quantity s, operations o_1..o_h, gold answer y) and a reader
(the instruction-tuned model, or a fine-tune with its adapters merged):
  D+  = the reader's prompt for X, then X's gold trace and 'Answer:' teacher-forced, then y
        (tokenised as the fine-tunes' training rows: `finetune.make_row`, `batch_arrays`);
  D−  = the same with the question's start quantity moved, X' (`moved_start`: s + δ, or
        s − δ where s + δ has another digit count; δ = the item's FactReversal offset 1..3):
        X' leads to y' ≠ y (every operation is increasing in its input), while the forced
        trace still states y's computation. D+ and D− differ in the start's digits only
        (token-aligned; checked, an item that is not is skipped and counted);
  L±  = log p(y | D±), summed over y's tokens;
  ΔL  = L+ − L−: the effect of the problem on the answer that bypasses the stated trace —
        the direct X → Y path (≈ 0 for a reader that reads its answer off the trace; large
        for one that computes or recalls it from the question);
  CEU_answer(ℓ)   = restoration of L by patching layer ℓ's read port (`layers_ℓ/attn:read`,
        the attention read) at the answer positions only (the positions that predict y's
        tokens), from D+ into D−;
  CEU_question(ℓ) = the same, patching only the part of that read that comes from the
        question's tokens (Π_S h, S = the question): the direct read of X at the answer.
The profile, its summary (overall and per stratum: memorised, the audit items the
fine-tunes were trained on; fresh), table and figure: `ceu_jax.audits.layer_probe`.

  pairs, skipped = probe_pairs(tok, domain, items)
  items = layer_probe.per_item(params, model_config, pairs, PROBES)
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ceu_jax.audits import layer_probe
from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces import finetune

DESCRIPTION = (
    'Arithmetic items, each reader: D+ = the prompt, the gold trace and "Answer:" teacher-'
    'forced, the gold answer y scored; D− = the same with the question\'s start quantity moved '
    '(±δ, same digits: the problem now leads elsewhere, the forced trace still to y). ΔL = '
    'log p(y | D+) − log p(y | D−): the direct X → Y path that bypasses the trace (≈ 0 for a '
    'reader that answers from its trace). CEU_answer(ℓ) = restoration by patching layer ℓ\'s '
    'read port (attention read) at the answer positions only, D+ → D−; CEU_question(ℓ) = the '
    'same for the part of that read that comes from the question\'s tokens (Π_S). CEU over '
    'non-degenerate items (ΔL ≥ ε); 95% bootstrap CIs over items.')
PROBES = ('answer', 'question')  # the whole read / its part read from the question's tokens
TITLES = ('CEU_answer: the read at the answer', 'CEU_question: its part read from the question')
START = ' has {} '                       # the start quantity's place in make_arith_item's text


def moved_start(item: ar.ArithItem) -> ar.ArithItem:
  """X' = X with the start quantity moved by δ (same digit count), the operations kept."""
  s, d = item.start, item.delta
  s2 = s + d if len(str(s + d)) == len(str(s)) else s - d
  old = START.format(s)
  if item.question.count(old) != 1 or s2 < 0:
    raise ValueError(f'item {item.id}: the start quantity {s} is not stated once as {old!r}')
  q = item.question.replace(old, START.format(s2))
  out = dataclasses.replace(item, question=q, start=s2)
  if out.answer == item.answer:
    raise AssertionError(f'item {item.id}: moving the start left the answer {item.answer}')
  return out


def probe_rows(dom: ar.ArithmeticDomain,
               item: ar.ArithItem) -> tuple[finetune.Row, finetune.Row]:
  """(D+, D−) rows: prompt, gold trace, 'Answer: y' (no end of demonstration)."""
  plus = finetune.make_row(dom, item, 'plain')
  if not plus.target.endswith(finetune.END):
    raise AssertionError(f'item {item.id}: the gold target does not end a demonstration')
  plus = dataclasses.replace(plus, target=plus.target[:-len(finetune.END)])
  return plus, dataclasses.replace(plus, prompt=dom.prompt(moved_start(item)))


def question_chars(prompt: str, primer: str) -> tuple[int, int]:
  """Character range of the last question's text in a prompt ('Question: …\\n<primer>')."""
  lo = prompt.rindex('Question: ') + len('Question: ')
  hi = len(prompt) - len(primer) - 1
  if prompt[hi:] != '\n' + primer:
    raise ValueError('the prompt does not end with the question, a newline and the primer')
  return lo, hi


def probe_pairs(tok, dom: ar.ArithmeticDomain, items: Sequence[ar.ArithItem]
                ) -> tuple[list[layer_probe.ProbePair], dict]:
  """The items' (D+, D−) pairs, and {id: reason} of the items skipped (not token-aligned)."""
  out, skipped = [], {}
  for x in items:
    plus, minus = probe_rows(dom, x)
    ids_p, n_t, flags = finetune.row_tokens(tok, plus)
    ids_m = finetune.row_tokens(tok, minus)[0]
    if len(ids_p) != len(ids_m):
      skipped[x.id] = 'not_token_aligned'
      continue
    lo, hi = question_chars(plus.prompt, dom.primer)
    offsets = tok.encode(plus.prompt, add_special_tokens=False).offsets
    question = tuple(a < hi and b > lo for a, b in offsets) + (False,) * (len(ids_p) - len(offsets))
    n_ans = len(flags) - flags.index(True)
    if not all(flags[-n_ans:]):
      raise AssertionError(f'item {x.id}: the answer does not end the row')
    out.append(layer_probe.ProbePair(x.id, tuple(ids_p), tuple(ids_m), n_ans, (None, question)))
  return out, skipped


def table(probes) -> str:
  return layer_probe.table(probes, PROBES)


def layer_figure(probes, stem: str) -> list[str]:
  return layer_probe.layer_figure(
      probes, PROBES, TITLES, stem,
      '§8.4 answer-position probe, trace held fixed, start quantity moved (95% CI)')
