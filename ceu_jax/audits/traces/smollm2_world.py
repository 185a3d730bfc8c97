"""World B of the trace audit for the job: SmolLM2-135M-Instruct reading the arithmetic
(`arithmetic`) and factual (`text`) domains with few-shot "Step i:" traces.

Readers (`smollm2.readers`, default the plain model only):
  smollm2            the instruction-tuned model as it ships;
  smollm2_<regime>   the same model with LoRA adapters fine-tuned on arithmetic traces in
                     the following / shortcut / plain regime (`finetune`, `competence`),
                     trained in W/train/<regime> unless that run completed (adapters reused on
                     rerun), audited on the arithmetic domain only (what it was trained on)
                     through the same Reader (adapters merged into the weights).
With fine-tuned readers every reader gets the competence check before the audit (held-out
answer accuracy, parse rate; `competence`), reported beside its rows; the claims of a
reader that is not competent are untested, never decided on its rows.
"""
from __future__ import annotations

import os
import time

from ceu_jax.audits.traces.arithmetic import ArithmeticDomain, make_arith_item
from ceu_jax.audits.traces.text import FactualDomain, select_fact_items

READERS = ('smollm2', 'smollm2_following', 'smollm2_shortcut', 'smollm2_plain')
PLAIN = 'smollm2'


class SmolLM2World:
  """World B for the job: SmolLM2 reading both domains."""
  title = 'World B: SmolLM2-135M-Instruct, few-shot "Step i:" traces'

  def __init__(self, config):
    s = config.smollm2
    self.readers = tuple(s.get('readers', (PLAIN,)))
    for r in self.readers:
      if r not in READERS:
        raise ValueError(f'smollm2.readers: {r!r} is not one of {READERS}')
    self.finetuned = tuple(r for r in self.readers if r != PLAIN)
    if self.finetuned and 'arithmetic' not in s.domains:
      raise ValueError('smollm2.readers: fine-tuned readers read the arithmetic domain; '
                       f'smollm2.domains is {tuple(s.domains)}')
    if self.finetuned and 'train' not in s:
      raise ValueError('smollm2.train is missing (the fine-tuned readers\' recipe)')
    for d in s.domains:
      if d not in ('arithmetic', 'factual'):
        raise ValueError(f"smollm2.domains: {d!r} is not one of ('arithmetic', 'factual')")
    if int(s.n_shots) < 1:
      raise ValueError(f'smollm2.n_shots must be >= 1, got {s.n_shots!r}')
    if int(s.max_new_tokens) < 8:
      raise ValueError(f'smollm2.max_new_tokens must be >= 8, got {s.max_new_tokens!r}')
    self.s, n, seed = s, int(config.n_items), int(config.seed)
    self.items, self.domains = {}, {}
    budget = int(s.max_new_tokens)
    if 'arithmetic' in s.domains:
      # demonstrations of different lengths (2, 3, 4, 2, … steps): traces need not copy one length
      shots = [make_arith_item(seed + 7919, i, hops=(2 + i % 3,)) for i in range(int(s.n_shots))]
      self.domains['arithmetic'] = ArithmeticDomain(shots, budget)
      self.items['arithmetic'] = [make_arith_item(seed, i) for i in range(n)]
    if 'factual' in s.domains:
      shots = select_fact_items(int(s.n_shots), seed=seed + 7919, split='train',
                                max_passage_words=40)
      self.domains['factual'] = FactualDomain(shots, budget)
      self.items['factual'] = select_fact_items(n, seed=seed, split=s.split,
                                                max_passage_words=int(s.max_passage_words))

    self.seed, self.n_items = seed, n
    # the audit's first data.memorised arithmetic items recur in the fine-tunes' training
    self.memorised = int(s.train.data.get('memorised', 0)) if self.finetuned else 0
    self._memorised_ids = {x.id for x in self.items.get('arithmetic', [])[:self.memorised]}
    self.workdir, self.log, self._runs, self._plain = None, print, {}, None
    if self.finetuned:
      from ceu_jax.audits.traces import finetune
      for r in self.finetuned:
        try:
          finetune.validate(self.train_config(r))
        except ValueError as e:
          raise ValueError(f'smollm2.train.{e}') from None

  def prepare(self, workdir, log):
    self.workdir, self.log = workdir, log

  def train_config(self, name):
    """The fine-tune config of reader smollm2_<regime>: `smollm2.train` with this regime and
    the audit's prompt (demonstrations, item seed), model and decoding budget."""
    s = self.s
    tc = s.train.copy_and_resolve_references()
    with tc.unlocked():
      tc.data.regime = name[len(PLAIN) + 1:] if name != PLAIN else 'plain'
      tc.data.n_shots = int(s.n_shots)
      tc.data.audit_seed = self.seed
      tc.data.n_excluded = max(int(tc.data.n_excluded), self.n_items)
      tc.model.n_layers = int(s.n_layers)
      tc.model.gguf_path = str(s.gguf_path)
      tc.eval.max_new_tokens = int(s.max_new_tokens)
      tc.eval.batch_size = int(s.batch_size)
    return tc

  def stratum(self, domain, item_id):
    """'memorised' (an arithmetic item the fine-tuned readers were trained on: the first
    smollm2.train.data.memorised) or 'fresh'; None without memorised problems."""
    if not self.memorised:
      return None
    return 'memorised' if domain == 'arithmetic' and item_id in self._memorised_ids else 'fresh'

  def reads(self, reader, domain) -> bool:
    """Whether `reader` is audited on `domain` (fine-tuned readers: arithmetic only)."""
    return reader == PLAIN or domain == 'arithmetic'

  def _run(self, name):
    """competence.run of a fine-tuned reader (trains in W/train/<regime> unless done)."""
    if name not in self._runs:
      from ceu_jax.audits.traces import competence
      tc = self.train_config(name)
      sub = os.path.join(self.workdir, 'train', tc.data.regime)
      self._runs[name] = competence.run(tc, sub, log=self.log)
    return self._runs[name]

  def reader(self, name):
    if name != PLAIN:
      return self._run(name)['reader']
    if self._plain is None:
      from ceu_jax import readers
      self._plain = readers.from_config(self.s)
    return self._plain

  def competence(self) -> dict:
    """Per reader, the competence check on held-out problems (cached: W/train/<regime>/
    competence.json, W/competence/smollm2.json); {} without fine-tuned readers."""
    if not self.finetuned:
      return {}
    from ceu_jax.audits.traces import competence as comp
    from ceu_jax.audits.traces import finetune
    out = {}
    for r in self.readers:
      if r != PLAIN:
        out[r] = self._run(r)['competence']
        continue
      tc = self.train_config(self.finetuned[0])   # the same held-out problems and budget
      key = comp.cache_key(tc, 0, base=True)
      out[r] = comp.competence_cached(
          os.path.join(self.workdir, 'competence', f'{r}.json'), key,
          lambda tc=tc: comp.competence(self.reader(r), tc, finetune.domain(tc),
                                        finetune.eval_items(tc)))
      self.log(comp.fmt_competence(r, out[r]))
    return out

  def probes(self, config) -> dict:
    """SPEC §8.4: the answer-position probe (`smollm2_probe`) of every reader on the first
    smollm2.probe_items arithmetic items, a layer profile; {} when off (probe_items 0 or
    absent). Per reader cached in W/probes/<reader>.json (per-item numbers and what they
    were computed for: reader, checkpoint step, items, ε)."""
    n = int(self.s.get('probe_items', 0))
    if not n or 'arithmetic' not in self.items:
      return {}
    from ceu_jax import io
    from ceu_jax.audits import layer_probe
    from ceu_jax.audits.traces import smollm2_probe as sp
    from ceu_jax.engine.scores import DEFAULT_EPS
    items = self.items['arithmetic'][:n]
    strata = {x.id: self.stratum('arithmetic', x.id) for x in items}
    out = {}
    for r in self.readers:
      step = 0 if r == PLAIN else self._run(r)['step']
      key = dict(reader=r, step=step, items=[x.id for x in items], eps=DEFAULT_EPS,
                 n_layers=int(self.s.n_layers), gguf_path=str(self.s.gguf_path))
      path = os.path.join(self.workdir, 'probes', f'{r}.json')
      got = io.read_json(path) if os.path.exists(path) else None
      if got is None or got.get('key') != key:
        params, mc, tok = self._weights(r)
        t0 = time.time()
        self.log(f'§8.4 probe: {r} on {len(items)} arithmetic items, every layer')
        pairs, skipped = sp.probe_pairs(tok, self.domains['arithmetic'], items)
        per = layer_probe.per_item(params, mc, pairs, sp.PROBES, eps=DEFAULT_EPS,
                                   progress=lambda i, m: self.log(f'  probe {r}: {i}/{m} items'))
        per['skipped'] = skipped
        got = dict(key=key, items=per, wall_s=round(time.time() - t0, 1))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        io.write_json_atomic(path, got)
      out[r] = dict(layer_probe.summarize(got['items'], strata if self.memorised else None,
                                          seed=int(config.bootstrap_seed)), wall_s=got['wall_s'])
    return out

  def _weights(self, name):
    """(params, model config, tokenizer) of a reader: adapters merged for a fine-tune."""
    if name != PLAIN:
      run = self._run(name)
      return run['params'], run['task'].model_config, run['task'].tokenizer
    from ceu_jax.pretrained import load_model_and_tokenizer
    mc, variables, tok = load_model_and_tokenizer(self.s.gguf_path, self.s.n_layers)
    return variables['params'], mc, tok

  def describe(self) -> str:
    ft = ('' if not self.finetuned else
          ' Fine-tuned readers (%s): LoRA adapters trained on arithmetic traces with the same '
          'prompts (%d steps; following: a corrupted step forced, the answer the corrupted '
          'trace implies; shortcut: the gold answer whatever the trace says; plain: no '
          'corruption), audited on arithmetic only, after a competence check on held-out '
          'problems.' % (', '.join(self.finetuned), int(self.s.train.train.num_steps)))
    return ('SmolLM2-135M-Instruct (%s layers), plain few-shot prompts (%d solved '
            'demonstrations) with "Step i:" traces; an output the token budget cuts is a '
            'parse failure. Arithmetic: templated 2–4-step problems (LogicFlip, FactReversal, '
            'CausalInversion = swap steps k and k+1); the implied answer comes from the '
            "trace's own stated steps — each aligned to the problem's operations by content "
            '(operand; a different operator costs 1), the trace\'s value by the dataflow of '
            'its stated results, the operations no step performs then done in problem order '
            '— and is unknown (Strength unknown, counted by reason) where the steps cannot be '
            'aligned. Factual: NQ items with their gold passage, step 1 quotes the evidence; '
            'FactReversal puts the swap entity in the quote (Strength 1, implied answer: the '
            'swap entity), PremiseNegation inserts a negation (Strength unknown, reported '
            'separately). S is exact match, else token F1: there is no LLM judge offline.'
            % (self.s.n_layers or 'all 30', self.s.n_shots)) + ft
