"""Fixed evaluation sets: tfds ArrayRecord, built once, reused, atomic, no TensorFlow."""
from __future__ import annotations

import dataclasses
import sys
import tempfile

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from ceu_jax.data import atr, corruptions, evalsets
from tests.conftest import ATR_CONFIGS, BATCH, fast_compile

CFG = ATR_CONFIGS["vfk_n128"]
SEED, NUM = 5, 300
NAMES = ("value_swap", "removal", "distractor_injection")


def _assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)


def _load(data_dir, **kw):
  args = dict(cfg=CFG, seed=SEED, num_examples=NUM, corruptions=NAMES, data_dir=data_dir)
  with fast_compile():
    return evalsets.load_eval_set(**(args | kw))


def test_load_builds_once_then_reuses(tmp_path, monkeypatch):
  first = _load(tmp_path)
  sets = list((tmp_path / "atr_eval_set").iterdir())
  assert len(sets) == 1 and sets[0].name.startswith("cfg_")
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]

  def no_rebuild(*args, **kwargs):
    raise AssertionError("the eval set was generated again")

  monkeypatch.setattr(evalsets, "eval_batches", no_rebuild)
  second = _load(tmp_path)
  _assert_same(first, second)
  assert "tensorflow" not in sys.modules


def test_loaded_set_equals_generator_output(tmp_path):
  plus, minus = _load(tmp_path)
  assert set(minus) == set(NAMES)
  with fast_compile():
    gen = atr.generate_batch(CFG, SEED, 0, BATCH, "eval")
    expected = {name: corruptions.corrupt(CFG, gen, name, evalsets.corruption_key(SEED, name))
                for name in NAMES}
  head = lambda b: jax.tree.map(lambda x: np.asarray(x)[:NUM], b)
  _assert_same(plus, head(gen))
  for name in NAMES:
    _assert_same(minus[name], head(expected[name]))
  # Readable by name through tfds, without the builder class being asked to build.
  source = tfds.data_source(f"atr_eval_set/{evalsets.config_name(_key())}",
                            data_dir=str(tmp_path), split="eval")
  assert len(source) == NUM
  np.testing.assert_array_equal(source[7]["minus"]["removal"]["context"],
                                minus["removal"].context[7])


def _key(**kw):
  args = dict(cfg=CFG, seed=SEED, num_examples=NUM, names=NAMES) | kw
  return evalsets.set_key(args["cfg"], args["seed"], args["num_examples"], args["names"])


def test_key_is_stable_and_separates_sets():
  name = evalsets.config_name(_key())
  assert name == evalsets.config_name(_key()) and name.startswith("cfg_")
  others = [_key(seed=SEED + 1), _key(num_examples=NUM + 1), _key(names=NAMES[:2]),
            _key(cfg=dataclasses.replace(CFG, eta=0.3))]
  assert len({name} | {evalsets.config_name(k) for k in others}) == 5


def test_key_names_the_generator_version(monkeypatch):
  """A set built by an older generator is never reused: its key differs."""
  assert _key()["generator"] == atr.GENERATOR_VERSION
  name = evalsets.config_name(_key())
  monkeypatch.setattr(atr, "GENERATOR_VERSION", atr.GENERATOR_VERSION + 1)
  assert evalsets.config_name(_key()) != name


def test_key_names_the_version_of_each_changed_corruption(monkeypatch):
  """A set holding a corruption whose D− changed (removal's filler passage) is never
  reused; a set without it keeps its key (and its files on disk)."""
  from ceu_jax.data import corruptions  # pylint: disable=g-import-not-at-top
  with_removal = _key(names=("value_swap", "removal"))
  assert with_removal["corruption_versions"] == {"removal": corruptions.VERSIONS["removal"]}
  assert "corruption_versions" not in _key(names=("value_swap",))
  name = evalsets.config_name(with_removal)
  monkeypatch.setitem(corruptions.VERSIONS, "removal", corruptions.VERSIONS["removal"] + 1)
  assert evalsets.config_name(_key(names=("value_swap", "removal"))) != name


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
  calls = []

  def interrupted(*args, **kwargs):
    calls.append(1)
    raise KeyboardInterrupt("build interrupted")

  real = evalsets.eval_batches
  monkeypatch.setattr(evalsets, "eval_batches", interrupted)
  with pytest.raises(KeyboardInterrupt):
    _load(tmp_path, num_examples=20)
  assert calls
  assert not (tmp_path / "atr_eval_set").exists()
  assert not list(tmp_path.iterdir())
  monkeypatch.setattr(evalsets, "eval_batches", real)
  plus, _ = _load(tmp_path, num_examples=20)
  assert plus.context.shape == (20, CFG.context_len)


@pytest.mark.parametrize("kw, message", [
    (dict(num_examples=0), r"num_examples must be an integer >= 1"),
    (dict(seed=-1), r"seed must be an integer >= 0"),
    (dict(corruptions=("value_swap", "blur")), r"corruption must be one of"),
])
def test_bad_arguments(tmp_path, kw, message):
  with pytest.raises(ValueError, match=message):
    _load(tmp_path, **kw)
  assert not list(tmp_path.iterdir())


def test_a_build_leaves_no_temporary_directory(tmp_path, monkeypatch):
  """tfds' bucket lookup (skipped: tfds_local) made an empty tmp*tfds directory per builder
  constructed over an unprepared directory and never removed it."""
  system_tmp = tmp_path / "system_tmp"
  system_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
  _load(tmp_path / "data", num_examples=8)
  assert list(system_tmp.iterdir()) == []
