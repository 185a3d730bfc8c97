"""World B of the trace audit for the job: SmolLM2-135M-Instruct reading the arithmetic
(`arithmetic`) and factual (`text`) domains with few-shot "Step i:" traces."""
from __future__ import annotations

from ceu_jax.audits.traces.arithmetic import ArithmeticDomain, make_arith_item
from ceu_jax.audits.traces.text import FactualDomain, select_fact_items


class SmolLM2World:
  """World B for the job: SmolLM2 reading both domains."""
  title = 'World B: SmolLM2-135M-Instruct, few-shot "Step i:" traces'
  readers = ('smollm2',)

  def __init__(self, config):
    s = config.smollm2
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

  def prepare(self, workdir, log):
    pass

  def reader(self, name):
    from ceu_jax import readers
    return readers.from_config(self.s)

  def describe(self) -> str:
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
            % (self.s.n_layers or 'all 30', self.s.n_shots))
