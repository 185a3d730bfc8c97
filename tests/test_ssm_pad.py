"""SPEC §1's identity S = all retrieved tokens ⇒ CEU_{f,S} = CEU_f on padded contexts
(FactQA's are ~20% PAD): the SSM's read port takes no input from PAD tokens, as the
attention read gives them no weight, so patching the span of every real token (of D+ or
D−) is the whole patch, on the CPU's scan and the accelerator's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import architectures
from ceu_jax import engine
from ceu_jax import retrieval_adapter as adapter
from ceu_jax.data import factqa
from tests.conftest import fast_compile

CFG = factqa.FactQAConfig(num_passages=4, context_len=128, eta=0.0, delta=0.5)
SMALL = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32, reader_heads=2, reader_layers=2,
             ssm_inner=8, ssm_state=4)


@pytest.mark.parametrize("scan_impl", ["linear", "chunked"])
def test_span_of_every_real_token_is_the_whole_patch(scan_impl):
  clean = factqa.generate_batch(CFG, seed=3, index=0, batch_size=8, split="eval")
  corrupt = factqa.corrupt(CFG, clean, "entity_swap", 1)
  real = (clean.context != 0) | (corrupt.context != 0)
  assert (~real).mean() > 0.1                                   # padded contexts
  mc = dict(family="ssm", preset="p100k", overrides=dict(SMALL, scan_impl=scan_impl))
  model = architectures.build_model(
      mc, vocab_size=CFG.vocab.size, context_len=CFG.context_len,
      num_passages=CFG.num_passages, query_len=CFG.query_len, answer_len=CFG.answer_len)
  with fast_compile():
    params = architectures.init_params(model, jax.random.PRNGKey(3))["params"]
    variables = {"params": jax.tree.map(lambda p: p * 3.0, params)}   # gates far from 0
    site = engine.Site.parse(str(architectures.read_port_site(mc)))
    res = engine.audit(adapter.loglik_fn_for(model), variables,
                       clean=adapter.ModelInputs.of(clean), corrupt=adapter.ModelInputs.of(corrupt),
                       site=site, probes=engine.Probes(span=jnp.stack([real, ~real]),
                                                       names=("real", "pad")))
  gap = np.asarray(res.L_plus - res.L_minus)
  assert np.abs(gap).max() > 1.0                                 # the patch moves something
  # S = every real token: L_int = L+ (the whole patch, SPEC §1); S = the PADs: L_int = L−.
  np.testing.assert_allclose(res.L_int[0], res.L_plus, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(res.L_int[1], res.L_minus, rtol=1e-5, atol=1e-4)
