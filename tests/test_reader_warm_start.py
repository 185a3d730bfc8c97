"""Warm-started reader fine-tunes (`lora.init_from`, `reader_finetune.warm_start`) and the
mediator's tool readers started from its no-tool readers (`smollm2.tool_init = no_tool`,
issue #35): the run starts from exactly the source's trained parameters, a source that is not
a completed run of the same model and lora fields is refused naming the field before
anything compiles, and the mediator trains the no-tool reader first and points the tool
reader at it."""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from ceu_jax.audits import reader_finetune
from ceu_jax.audits.mediator import finetune as F
from ceu_jax.audits.mediator import worlds
from ceu_jax.pretrained import gguf_loader
from configs import mediator as mediator_config
from configs import smollm2_checklist as C

# compile-bound (short runs of many small programs): most XLA optimisations off
# (2026-11-30, alone beside a copy with them on: 39 -> 29 s)
pytestmark = pytest.mark.usefixtures("fast_compiled_module")

_WHY = gguf_loader.is_available()
needs_model = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')


def _world(tool_init='no_tool', steps=3):
  c = mediator_config.get_config('tiny,world=smollm2,n_items=2,finetuned=faithful+shortcut')
  with c.unlocked():
    c.smollm2.tool_init, c.smollm2.tool_init_steps = tool_init, steps
  return worlds.make_world(c)


def test_tool_readers_start_from_the_no_tool_reader_of_their_regime():
  w = _world()
  for regime in ('faithful', 'shortcut'):
    tool = w.train_config(f'smollm2_lora/{regime}', True)
    plain = w.train_config(f'smollm2_lora/{regime}', False)
    assert tool.lora.init_from == os.path.join('..', regime) and plain.lora.init_from == ''
    assert tool.train.num_steps == 3 and plain.train.num_steps == C.get_config('tiny').train.num_steps
    assert tool.train.warmup_steps <= 3
  fresh = _world('fresh').train_config('smollm2_lora/faithful', True)
  assert fresh.lora.init_from == '' and fresh.train.num_steps == C.get_config('tiny').train.num_steps


def test_bad_tool_init_is_refused_naming_the_field():
  with pytest.raises(ValueError, match=r"smollm2.tool_init must be one of \('fresh', 'no_tool'\)"):
    _world('warm')
  with pytest.raises(ValueError, match='smollm2.tool_init_steps must be an integer >= 1'):
    _world('no_tool', 0)


def test_the_no_tool_reader_is_run_before_the_tool_reader_it_starts(monkeypatch, tmp_path):
  from ceu_jax.audits.mediator import competence
  calls = []
  monkeypatch.setattr(competence, 'run', lambda config, sub, log: calls.append(
      (os.path.basename(sub), config.lora.init_from)) or {'step': 0})
  w = _world()
  w.workdir = str(tmp_path)
  w._run('smollm2_lora/shortcut', True)
  w._run('smollm2_lora/shortcut', False)          # cached: not run again
  assert calls == [('shortcut', ''), ('shortcut_tool', os.path.join('..', 'shortcut'))]


def _tiny(tmp, name, **kw):
  c = C.get_config('tiny')
  with c.unlocked():
    c.train.num_steps, c.train.warmup_steps, c.train.checkpoint_every = 2, 1, 1
    c.train.async_checkpointing = False
    for k, v in kw.items():
      sec, field = k.split('__')
      c[sec][field] = v
  return c, str(tmp / name)


@needs_model
def test_warm_start_begins_at_the_sources_trained_parameters(tmp_path):
  from ceu_jax.train import loop
  src_cfg, src = _tiny(tmp_path, 'faithful')
  src_task = F.SmolLM2ChecklistTask.from_config(src_cfg)
  assert reader_finetune.train_unless_done(src_cfg, src, src_task, 'src', log=lambda m: None)
  trained, _ = loop.restore_trainable(src_task, src)
  # bad sources, refused naming the field before anything is restored or compiled
  for kw, msg in ((dict(lora__init_from='../nowhere'), 'holds no completed fine-tune'),
                  (dict(lora__init_from='../faithful', lora__rank=2),
                   r'other model / lora fields \(there -> here\): lora.rank 4 -> 2')):
    cfg, dst = _tiny(tmp_path, 'bad', data__tool=True, **kw)
    with pytest.raises(ValueError, match=r"lora.init_from='\.\./.*" + msg):
      reader_finetune.warm_start(cfg, dst, F.SmolLM2ChecklistTask.from_config(cfg))
  cfg, dst = _tiny(tmp_path, 'faithful_tool', data__tool=True, lora__init_from='../faithful')
  task = F.SmolLM2ChecklistTask.from_config(cfg)
  logs: list = []
  reader_finetune.warm_start(cfg, dst, task, log=logs.append)
  start = task.init_params(jax.random.PRNGKey(7))
  fresh = F.SmolLM2ChecklistTask.from_config(cfg).init_params(jax.random.PRNGKey(7))
  jax.tree.map(np.testing.assert_array_equal, start, trained)
  assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(
      jax.tree.leaves(start), jax.tree.leaves(fresh)))     # not the fresh adapters
  assert logs == [f'warm start: the trained parameters of {os.path.normpath(src)} (step 2)']
  task.init_tree = None                                  # train_unless_done sets it again
  assert reader_finetune.train_unless_done(cfg, dst, task, 'dst', log=logs.append)
  after, step = loop.restore_trainable(task, dst)
  assert step == 2 and any('warm start' in m for m in logs)
  # two steps (the first at learning rate 0) from the source's parameters: close to them, far from a fresh start's
  d_src = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(trained)))
  d_fresh = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(fresh)))
  assert 0 < d_src < d_fresh


@needs_model
def test_teacher_forced_verdicts_equal_a_one_row_full_forward_reference():
  """`teacher_forced.verdicts` (left-padded batches, the last n logits only) against each
  row alone, unpadded, every position's logits, the verdict tokens found by their text
  (SmolLM2 writes ' YES' as ' Y' 'ES': the first token decides)."""
  import jax.numpy as jnp
  from ceu_jax.audits.mediator import teacher_forced as TF
  from ceu_jax.pretrained import model as M
  cfg = C.get_config('tiny')
  task = F.SmolLM2ChecklistTask.from_config(cfg)
  items = task.held_out + task.pool[:1]                       # 3 checklists, 2 batches
  got = TF.verdicts(task, task.base, items, batch_size=2)
  assert got['n'] == 3 and [x['id'] for x in got['items']] == [c.id for c in items]
  for c, x in zip(items, got['items']):
    row = F.make_row(task.task, c, 'plain')
    ids, n_t, _ = task.encode(row)
    logits = M.SmolLM(task.model_config).apply(
        {'params': task.base}, jnp.asarray([ids[:-1]]), jnp.ones((1, len(ids) - 1), bool))
    logp = np.asarray(jax.nn.log_softmax(M.as_f32(logits[0]), -1))
    words = [task.tokenizer.decode([t]).strip() for t in ids[len(ids) - n_t:]]
    at = [len(ids) - n_t + k for k, w in enumerate(words)      # ' NO', or ' Y' of ' Y' 'ES'
          if k and words[k - 1] == ':' and w in ('Y', 'NO')]
    assert [words[a - len(ids) + n_t] == 'Y' for a in at] == [bool(g) for g in c.gold]
    np.testing.assert_allclose(x['logp'], [logp[a - 1, ids[a]] for a in at], atol=1e-5)
    assert x['right'] == [bool(np.argmax(logp[a - 1]) == ids[a]) for a in at]
  assert got['line_accuracy'] == np.mean([x['right'] for x in got['items']])
  with pytest.raises(ValueError, match="prompts must be one of"):
    TF.run(cfg, '/nonexistent', prompts='both')
