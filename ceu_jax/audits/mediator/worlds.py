"""The worlds of the mediator job (configs/mediator.py `world`).

  world = make_world(config)     # validated: ValueError naming the field, nothing built

A world has `items` and `ids` (after `prepare(workdir, log)`), `readers` (names),
`task(name, tool)` (the mediated task a setting is audited on), `reader(name,
tool)` (built once per setting, lazily) and, World A only, `probe(name, tool)`:
  atr      World A: checklist ATR; per (family, regime, tool) a reader trained
           through `ceu_jax.audits.trained` in W/train/<family>_<regime>[_tool]
           (resumed / reused when done), with the §8.4 decision-position probe;
  oracle   World A items read by the oracle readers (follower, gold computer,
           constant): exact known answers, no training;
  smollm2  World B: SmolLM2-135M-Instruct grades text checklists on the shipped
           passages, one setting per prompt regime × tool; the checklists are
           planned once in W/plan.json. One reader serves every setting.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable

from ceu_jax import io
from ceu_jax.audits.mediator.checklist_world import ChecklistTask
from ceu_jax.data.checklist import ChecklistConfig

WORLDS = ('atr', 'oracle', 'smollm2')


def _task(config) -> ChecklistTask:
  data = dict(config.atr.data.to_dict())
  data.pop('task', None)
  return ChecklistTask(ChecklistConfig(**data))


def make_world(config):
  """The world of `config`; checks that need no model (ValueError naming the field)."""
  if config.world not in WORLDS:
    raise ValueError(f"world must be one of {WORLDS}, got {config.world!r}")
  for name in ('n_items', 'items_per_chunk', 'min_cell'):
    v = config[name]
    if not isinstance(v, int) or v < 1:
      raise ValueError(f'{name} must be an integer >= 1, got {v!r}')
  if not config.tools or any(not isinstance(t, bool) for t in config.tools):
    raise ValueError(f'tools must be a non-empty tuple of bools, got {config.tools!r}')
  return {'atr': AtrWorld, 'oracle': OracleWorld, 'smollm2': SmolLM2World}[config.world](config)


class _World:
  readers: tuple = ()

  def __init__(self, config):
    self.config = config
    self.base_task = _task(config)
    self.log: Callable[[str], None] = print
    self.workdir = ''
    self._readers: dict = {}

  def prepare(self, workdir: str, log) -> None:
    self.workdir, self.log = workdir, log
    self.items = self.base_task.instances(self.config.n_items, self.config.seed)
    self.ids = [f'x{k}' for k in range(len(self.items))]

  def task(self, name: str, tool: bool):
    """World A: the checklist task in the setting's mode (the forced prefix ends at its cue)."""
    return self.base_task.with_tool(tool)

  def reader(self, name: str, tool: bool):
    if (name, tool) not in self._readers:
      self._readers[(name, tool)] = self._build(name, tool)
    return self._readers[(name, tool)]


class OracleWorld(_World):
  readers = ('follower', 'gold_computer', 'constant')

  def _build(self, name, tool):
    from ceu_jax.readers import mediator_oracles as mo
    o, task = self.config.oracle, self.task(name, tool)
    if name == 'follower':
      return mo.MediatorFollower(task, tool=tool, p_error=o.p_error, p_swap=o.p_swap)
    if name == 'gold_computer':
      return mo.GoldComputer(task, tool=tool, p_error=o.p_error, p_swap=o.p_swap)
    return mo.ConstantReader(task, tuple(o.constant), o.constant_y, tool=tool)


class AtrWorld(_World):
  """Trained checklist readers: every (family, regime) with and without the tool."""

  def __init__(self, config):
    from ceu_jax.audits.trained import check_train_config
    super().__init__(config)
    self.readers = tuple(f'{f}/{r}' for f in config.atr.families for r in config.atr.regimes)
    for name in self.readers:
      for tool in config.tools:
        check_train_config(self.train_config(name, tool), 'atr.train')

  def train_config(self, name: str, tool: bool):
    """`atr.train` (the config file's reader recipe) with this family and the audited
    world's data under the reader's regime and tool."""
    family, regime = name.split('/')
    tc = self.config.atr.train.copy_and_resolve_references()
    with tc.unlocked():
      tc.model.family = family
      tc.data = type(tc.data)(self.config.atr.data.to_dict())
      tc.data.regime, tc.data.tool = regime, tool
    return tc

  def train_dir(self, name: str, tool: bool) -> str:
    family, regime = name.split('/')
    return os.path.join(self.workdir, 'train', f'{family}_{regime}{"_tool" if tool else ""}')

  def _build(self, name, tool):
    from ceu_jax.audits.trained import trained_reader
    reader, _ = trained_reader(self.train_config(name, tool), self.train_dir(name, tool),
                               self.log, batch_size=self.config.atr.batch_size)
    return reader

  def probe(self, name: str, tool: bool) -> dict:
    """The §8.4 decision-position probe of one setting (cached in W/probes)."""
    from ceu_jax.audits.mediator import probe as mediator_probe
    from ceu_jax.auditor import audited_model
    path = os.path.join(self.workdir, 'probes', f"{setting_key(name, tool)}.json")
    if os.path.exists(path):
      return io.read_json(path)
    reader = self.reader(name, tool)
    bundle = audited_model(self.train_config(name, tool))
    cfg = dataclasses.replace(self.base_task.cfg, tool=tool)
    c = self.config
    out = mediator_probe.decision_probe(reader.model, reader.variables, bundle.site, cfg,
                                        c.atr.probe_items, seed=c.seed,
                                        boot_seed=c.bootstrap_seed)
    io.write_json_atomic(path, out)
    return out


FINETUNED = 'smollm2_lora'   # World B's fine-tuned checklist readers: smollm2_lora/<regime>


class SmolLM2World(_World):
  """World B: one SmolLM2 reader for every (prompt regime, tool) setting; with
  smollm2.finetuned, also the checklist readers smollm2_lora/<regime> (SmolLM2 + LoRA
  fine-tuned in that regime, with or without the tool: `mediator.finetune`), trained in
  W/train/<regime>[_tool] unless done, each checked for competence before it is audited."""

  def __init__(self, config):
    super().__init__(config)
    b = config.smollm2
    self.finetuned = tuple(b.get('finetuned', ()))
    self.readers = (tuple(f'smollm2/{r}' for r in b.regimes)
                    + tuple(f'{FINETUNED}/{r}' for r in self.finetuned))
    self._model = None
    self._tasks: dict = {}
    self._runs: dict = {}
    self._base = None   # (params, model config, tokenizer, template) of the prompted model
    if self.finetuned:
      from ceu_jax.audits.mediator import finetune
      for r in self.finetuned:
        for tool in config.tools:
          try:
            finetune.validate(self.train_config(f'{FINETUNED}/{r}', tool))
          except ValueError as e:
            raise ValueError(f'smollm2.train.{e}') from None
      from ceu_jax.audits.mediator import smollm2_probe
      smollm2_probe.probes_of(probe_names(config))   # ValueError naming the field

  def train_config(self, name: str, tool: bool):
    """The fine-tune config of reader smollm2_lora/<regime>: `smollm2.train` with this regime
    and tool, and the audit's checklists (seed, n_items, r, passage length), chat mode,
    model and decoding batch."""
    b, c = self.config.smollm2, self.config
    tc = b.train.copy_and_resolve_references()
    with tc.unlocked():
      tc.data.regime, tc.data.tool = name.split('/')[1], bool(tool)
      tc.data.audit_seed, tc.data.audit_n_items = int(c.seed), int(c.n_items)
      tc.data.r, tc.data.max_passage_words = int(b.r), int(b.max_passage_words)
      tc.data.chat = bool(b.chat)
      tc.model.n_layers, tc.model.gguf_path = int(b.n_layers), str(b.gguf_path)
      tc.eval.batch_size = int(b.batch_size)
      if tool and self.warm_tool:   # from the no-tool reader of the regime (configs/mediator.py)
        tc.lora.init_from = os.path.join('..', name.split('/')[1])
        tc.train.num_steps = int(b.tool_init_steps)
        tc.train.warmup_steps = min(int(tc.train.warmup_steps), tc.train.num_steps)
    return tc

  @property
  def warm_tool(self) -> bool:
    """smollm2.tool_init: the tool readers start from the no-tool readers (ValueError
    naming the field for another value than fresh | no_tool)."""
    b = self.config.smollm2
    v = b.get('tool_init', 'fresh')
    if v not in ('fresh', 'no_tool'):
      raise ValueError(f"smollm2.tool_init must be one of ('fresh', 'no_tool'), got {v!r}")
    n = b.get('tool_init_steps', 1)
    if v == 'no_tool' and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
      raise ValueError(f'smollm2.tool_init_steps must be an integer >= 1, got {n!r}')
    return v == 'no_tool'

  def _run(self, name: str, tool: bool) -> dict:
    """competence.run of a fine-tuned reader (trains in W/train/<regime>[_tool] unless done)."""
    if (name, tool) not in self._runs:
      from ceu_jax.audits.mediator import competence
      if tool and self.warm_tool:
        self._run(name, False)      # the no-tool reader its adapters start from
      sub = os.path.join(self.workdir, 'train', name.split('/')[1] + ('_tool' if tool else ''))
      self._runs[(name, tool)] = competence.run(self.train_config(name, tool), sub,
                                                log=self.log)
    return self._runs[(name, tool)]

  def probes(self) -> dict:
    """SPEC §8.4: the decision-position probe (`mediator.smollm2_probe`) of every setting on
    the first smollm2.probe_items checklists, a layer profile; {} when off (0 or absent).
    Per setting cached in W/probes/<setting>.json (per-item numbers and what they were
    computed for: setting, checkpoint step, checklists, ε); under smollm2.probe_names =
    follow_input in W/probes/<setting>_follow_input.json (`smollm2_probe` module doc)."""
    n = int(self.config.smollm2.get('probe_items', 0))
    if not n:
      return {}
    names = probe_names(self.config)
    from ceu_jax.audits import layer_probe
    from ceu_jax.audits.mediator import smollm2_probe as sp
    from ceu_jax.engine.scores import DEFAULT_EPS
    items, b, out = self.items[:n], self.config.smollm2, {}
    for name in self.readers:
      for tool in self.config.tools:
        ft = name.startswith(FINETUNED + '/')
        key = dict(setting=setting(name, tool), step=self._run(name, tool)['step'] if ft else 0,
                   items=[c.id for c in items], eps=DEFAULT_EPS, n_layers=int(b.n_layers),
                   gguf_path=str(b.gguf_path))
        suffix = ''
        if self.task(name, tool).named_arg:   # the argument's verdicts scored, not its names
          key['scored'] = 'verdicts'
        if names != 'verbatim':
          key['names'], suffix = names, f'_{names}'
        path = os.path.join(self.workdir, 'probes', f'{setting_key(name, tool)}{suffix}.json')
        got = io.read_json(path) if os.path.exists(path) else None
        if got is None or got.get('key') != key:
          params, mc, tok, template = self._weights(name, tool)
          self.log(f'§8.4 probe: {setting(name, tool)} on {len(items)} checklists, every layer')
          t0 = time.time()
          pairs, skipped = sp.probe_pairs(tok, self.task(name, tool), template, items, names)
          per = layer_probe.per_item(params, mc, pairs, sp.probes_of(names)[0], eps=DEFAULT_EPS,
                                     progress=lambda i, m, k=setting(name, tool):
                                     self.log(f'  probe {k}: {i}/{m} checklists'))
          per['skipped'] = skipped
          got = dict(key=key, items=per, wall_s=round(time.time() - t0, 1))
          os.makedirs(os.path.dirname(path), exist_ok=True)
          io.write_json_atomic(path, got)
        out[setting(name, tool)] = dict(layer_probe.summarize(
            got['items'], seed=int(self.config.bootstrap_seed)), wall_s=got['wall_s'])
    return out

  def _weights(self, name: str, tool: bool):
    """(params, model config, tokenizer, chat template) of a setting's reader."""
    if name.startswith(FINETUNED + '/'):
      run = self._run(name, tool)
      return run['params'], run['task'].model_config, run['task'].tokenizer, run['task'].template
    if self._base is None:   # the prompted model, loaded once for every prompted setting
      from ceu_jax.pretrained import load_model_and_tokenizer
      from ceu_jax.readers.chat import ChatTemplate, gguf_chat_template
      b = self.config.smollm2
      mc, variables, tok = load_model_and_tokenizer(b.gguf_path, b.n_layers)
      text = gguf_chat_template(str(b.gguf_path) or None)
      self._base = (variables['params'], mc, tok,
                    None if text is None else ChatTemplate.from_template(text))
    return self._base

  def competence(self) -> dict:
    """{setting: competence check} of every fine-tuned setting ({} without any)."""
    return {setting(n, t): self._run(n, t)['competence'] for n in self.readers
            for t in self.config.tools if n.startswith(FINETUNED + '/')}

  def prepare(self, workdir, log):
    from ceu_jax.audits.mediator import checklist_text as ct
    self.workdir, self.log = workdir, log
    b, path = self.config.smollm2, os.path.join(workdir, 'plan.json')
    if os.path.exists(path):
      plan = [ct.Checklist(**{k: tuple(v) if isinstance(v, list) else v for k, v in x.items()})
              for x in io.read_json(path)]
    else:
      plan = ct.build(self.config.n_items + 1, r=b.r, seed=self.config.seed,
                      max_words=b.max_passage_words)
      io.write_json_atomic(path, [dataclasses.asdict(c) for c in plan])
    self.items, self.demo = plan[:-1], plan[-1]  # the demonstration is never audited
    self.ids = [c.id for c in self.items]

  def task(self, name, tool):
    from ceu_jax.audits.mediator import checklist_text as ct
    if (name, tool) not in self._tasks:
      b = self.config.smollm2
      if name.startswith(FINETUNED + '/'):   # the prompt the reader was fine-tuned on
        from ceu_jax.audits.mediator import finetune
        self._tasks[(name, tool)] = finetune.text_task(self.train_config(name, tool), self.demo)
      else:
        self._tasks[(name, tool)] = ct.TextChecklistTask(
            name.split('/')[1], tool=tool, r=b.r, demo=self.demo if b.n_shots else None,
            chat=b.chat)
    return self._tasks[(name, tool)]

  def _build(self, name, tool):
    if name.startswith(FINETUNED + '/'):
      return self._run(name, tool)['reader']
    if self._model is None:
      from ceu_jax import readers
      self._model = readers.from_config(self.config.smollm2)
    return self._model


def probe_names(config) -> str:
  """smollm2.probe_names ('verbatim' when absent: runs made before the field existed)."""
  return str(config.smollm2.get('probe_names', 'verbatim'))


def setting(name: str, tool: bool) -> str:
  """'attention/faithful +tool': a setting's name in tables."""
  return f'{name}{" +tool" if tool else ""}'


def setting_key(name: str, tool: bool) -> str:
  """'attention_faithful_tool': a setting's name in file names."""
  return setting(name, tool).replace('/', '_').replace(' +', '_')
