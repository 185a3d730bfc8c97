"""atr_lines.Stream: the generator's random fields are uniform, independent of one
another although packed several to a word, and a pure function of the key.

Each statistic pools one draw over 4,096 keys (rows of 72 values); p-value
threshold 1e-4 per test, as in test_atr_reference.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ceu_jax.data import atr_lines

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: 11 -> 2 CPU-s

KEYS, LINES = 4096, 72
P_MIN = 1e-4


def draws(fn):
  """fn(stream) for KEYS independent keys, as numpy [KEYS, ...] (per output)."""
  keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.PRNGKey(3), r))(
      jnp.arange(KEYS))
  out = jax.jit(jax.vmap(lambda k: fn(atr_lines.Stream(k))))(keys)
  return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("n", [2, 4, 5, 63, 64, 72, 100])
def test_randint_uniform(n):
  x = draws(lambda s: s.randint((LINES, 2), n))
  assert x.shape == (KEYS, LINES, 2) and x.min() >= 0 and x.max() < n
  counts = np.bincount(x.ravel(), minlength=n)
  assert stats.chisquare(counts).pvalue > P_MIN


@pytest.mark.parametrize("p", [0.0, 1.0, 0.5, 0.25, 0.3, 0.1, 0.999])
def test_bernoulli_rate(p):
  x = draws(lambda s: s.bernoulli(p, (LINES,)))
  assert x.dtype == bool and x.shape == (KEYS, LINES)
  if p in (0.0, 1.0):
    assert (x == bool(p)).all()
    return
  k, m = int(x.sum()), x.size
  assert stats.binomtest(k, m, p).pvalue > P_MIN, (k / m, p)


def test_packed_fields_are_independent():
  """Fields that share a word (first fit) and the rows of one hash: pairwise
  contingency tables pass a chi-square test of independence."""
  def fn(s):
    return jnp.stack([s.bernoulli(0.5, (LINES,)).astype(jnp.int32),   # bit 0, row 0
                      s.randint((LINES,), 4),                          # bits 1-2, row 0
                      s.randint((LINES,), 63),                         # row 1 (spare)
                      s.randint((LINES,), 8)], -1)                     # bits 3-5, row 0
  x = draws(fn).reshape(-1, 4)
  sizes = (2, 4, 63, 8)
  for i in range(4):
    for j in range(i + 1, 4):
      table = np.zeros((sizes[i], sizes[j]))
      np.add.at(table, (x[:, i], x[:, j]), 1)
      assert stats.chi2_contingency(table).pvalue > P_MIN, (i, j)


def test_scalars_and_shapes():
  x = draws(lambda s: (s.randint((), 6), s.bernoulli(0.3), s.randint((3, 2, 2), 16)))
  assert x[0].shape == (KEYS,) and x[1].shape == (KEYS,) and x[2].shape == (KEYS, 3, 2, 2)


def test_pure_function_of_the_key():
  def fn(key):
    s = atr_lines.as_stream(key)
    return s.randint((LINES, 5), 64), s.bernoulli(0.3, (LINES,)), s.randint((), 72)

  a = jax.jit(fn)(jax.random.PRNGKey(7))
  b = jax.jit(fn)(jax.random.key(7))            # typed keys give the same bits
  c = fn(jax.random.PRNGKey(8))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert (np.asarray(a[0]) != np.asarray(c[0])).mean() > 0.9


def test_stream_blocks_are_threefry():
  """A row is threefry2x32(key, (STREAM_TAG, j)), jax.random's own hash."""
  key = jax.random.PRNGKey(11)
  row = atr_lines.Stream(key).fields((LINES,), 32)
  count = jnp.concatenate([jnp.full((LINES,), atr_lines.STREAM_TAG, jnp.uint32),
                           jnp.arange(LINES, dtype=jnp.uint32)])
  expected = jax.extend.random.threefry_2x32((key[0], key[1]), count)[:LINES]
  np.testing.assert_array_equal(row, expected)
