"""Teacher-forced verdicts of a checklist reader (issue #35): did a fine-tune learn to grade?

  out = verdicts(task, params, items)          # task: finetune.SmolLM2ChecklistTask
  out = run(config, workdir, prompts='tool')   # a fine-tune workdir's adapters

Each checklist's gold answer (its restated lines, the cue and the decision: `finetune.make_row`
in the plain regime) is fed to the reader after its prompt, and at the token holding each
line's verdict (YES / NO after '<entity>: '; SmolLM2 writes ' YES' as ' Y' 'ES', so the first
token decides) the reader's next-token distribution is read: the line is right when its
argmax is the gold verdict's token. No generation: a reader that grades well here but not
when it generates fails at decoding; one that grades badly here did not learn to grade.
`prompts` audits a reader under the other prompt (the tool instruction added or removed): the
verdicts come before the decision, so only the instruction differs.

Shape legend: B rows of a batch, T row tokens, n scored target positions, V vocabulary.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.audits.mediator import finetune as F

PROMPTS = ('same', 'tool', 'no_tool')
ITEMS = ('held_out', 'audit')


def verdict_tokens(tok, row: F.Row) -> list[int]:
  """Per checklist line, the index among the target's tokens of the token that holds its
  verdict's first character (ValueError for a row whose lines do not name their entity)."""
  enc = tok.encode(row.target, add_special_tokens=False)
  out, start = [], 0
  for k, ent in enumerate(row.checklist.entities):
    head = f'{k + 1}. {ent}: '
    at = row.target.find(head, start)
    if at < 0:
      raise ValueError(f'row {row.checklist.id}: line {k + 1} does not read {head!r} '
                       '(teacher-forced verdicts need restated lines: data.restate)')
    j = at + len(head)
    out.append(next(t for t, (a, b) in enumerate(enc.offsets) if a <= j < b))
    start = j
  return out


def verdicts(task: F.SmolLM2ChecklistTask, params: dict, items: Sequence[ct.Checklist], *,
             batch_size: int = 8) -> dict:
  """The teacher-forced verdicts of the reader `params` on `items` (module doc): n, line
  accuracy, by line position, checklist accuracy (every line right), the mean NLL of the gold
  verdict tokens, and per item its lines' right flags and gold log-probabilities."""
  import jax
  import jax.numpy as jnp
  from ceu_jax.pretrained import model as M
  from ceu_jax.pretrained import sft
  d = task.config.data
  length, n = max(int(d.max_len), int(d.max_len_tool)), task.n_tail   # one compiled shape

  @jax.jit
  def fwd(p, t, v, tgt):     # per target position: argmax == tgt, log p(tgt)   [B, n] each
    logp = jax.nn.log_softmax(M.as_f32(M.SmolLM(task.model_config).apply(
        {'params': p}, t, v, n_logits=n)), -1)                            # [B, n, V]
    return (jnp.argmax(logp, -1) == tgt,
            jnp.take_along_axis(logp, tgt[..., None], -1)[..., 0])

  per_item = []
  for b in range(0, len(items), batch_size):
    rows = [F.make_row(task.task, c, 'plain') for c in items[b:b + batch_size]]
    enc = [task.encode(r) for r in rows]
    fill = batch_size - len(rows)              # the last batch: filled with copies of a row
    bt = sft.pack(enc + enc[:1] * fill, length, n, [r.checklist.id for r in rows + rows[:1] * fill],
                  len_field='data.max_len / data.max_len_tool')
    hit, lp = map(np.asarray, fwd(params, bt['tokens'][:, :-1], bt['valid'][:, :-1],
                                  bt['tokens'][:, -n:]))                   # [B, n]
    for i, r in enumerate(rows):
      cols = [n - enc[i][1] + t for t in verdict_tokens(task.tokenizer, r)]
      per_item.append(dict(id=r.checklist.id, right=[bool(hit[i, c]) for c in cols],
                           logp=[float(lp[i, c]) for c in cols]))
  right = np.array([x['right'] for x in per_item])                         # [items, r]
  return dict(n=len(per_item), line_accuracy=float(right.mean()),
              by_line=[float(v) for v in right.mean(0)],
              checklist_accuracy=float(right.all(1).mean()),
              verdict_nll=float(-np.mean([x['logp'] for x in per_item])), items=per_item)


def run(config: Any, workdir: str, *, prompts: str = 'same', items: str = 'held_out',
        n: int = 0, log: Callable[[str], None] = print) -> dict:
  """The teacher-forced verdicts of the fine-tune in `workdir` (its newest checkpoint; the
  config's model and lora fields must be the workdir's) on its held-out checklists or the
  audit's, under its own prompt or the other one (`prompts`); n > 0: the first n items."""
  from ceu_jax.audits import reader_finetune
  from ceu_jax.pretrained import lora as lora_lib
  from ceu_jax.train import loop
  if prompts not in PROMPTS or items not in ITEMS:
    raise ValueError(f'prompts must be one of {PROMPTS} and items one of {ITEMS}, got '
                     f'{prompts!r}, {items!r}')
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    raise ValueError(f'n must be an integer >= 0, got {n!r}')
  reader_finetune.check_same_fields(config, workdir, 'workdir')
  task = F.SmolLM2ChecklistTask.from_config(config)
  tree, step = loop.restore_trainable(task, workdir)
  params = lora_lib.merged(tree, task.base, task.lora)
  if prompts != 'same':
    task.task = dataclasses.replace(task.task, tool=prompts == 'tool')
  chosen = task.held_out if items == 'held_out' else F.audit_plan(config)[:-1]
  out = verdicts(task, params, chosen[:n] if n else chosen)
  out.update(workdir=workdir, step=step, prompts=prompts, tool_prompt=task.task.tool,
             which=items)
  log(f"teacher-forced verdicts of {workdir} (step {step}) on {out['n']} {items} checklists, "
      f"{'tool' if task.task.tool else 'no-tool'} prompts: lines right "
      f"{out['line_accuracy']:.3f} (by line {', '.join(f'{v:.3f}' for v in out['by_line'])}), "
      f"checklists right {out['checklist_accuracy']:.3f}, verdict NLL {out['verdict_nll']:.3f}")
  return out
