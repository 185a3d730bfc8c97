"""Fixed evaluation sets: one definition for every task; ATR-insert's materialised
once as a tfds ArrayRecord dataset.

`fixed_eval_set(task, data_cfg, split=, seed=, num_examples=, corruptions=)` is
THE evaluation set of (task, data config, split, seed, size, corruptions):
example i is example i of the task's `split` stream of `seed`, generated in
chunks of CHUNK, and D− of corruption c uses `corruption_key(seed, c)`.
Training-time evaluation, `experiments.audit`, the grid's test conditions and
the benchmarks all take their examples from it, and every result records its
`identity` (the key above plus a digest of the arrays). ATR-insert sets of the
'eval' split are read from (and built once into) the tfds dataset below when a
data directory is given; in memory they are generated — the same arrays.

Every cell of a grid is scored on the same examples: the set of an
(ATR config, seed, size, corruptions) key holds D+ (every `RetrievalBatch`
field) and, per corruption, the fields of D− that a corruption changes
(context, changed_mask, has_evidence, line_kind, distractor_mask,
hard_negative_mask; evidence_mask and value_mask stay E(D+), conventions §1).

Layout on disk (no TensorFlow needed to write or read):
  {data_dir}/atr_eval_set/cfg_{hash}/1.0.0/atr_eval_set-eval.array_record-*
where `hash` is a stable hash of the data config, seed, size, corruptions,
`atr.GENERATOR_VERSION` and the held corruptions' `corruptions.VERSIONS` (a set from an
older generator or corruption is never reused).
A set is built into a temporary directory and moved into place with one
`os.replace`, so an interrupted build never leaves a half-written set.

Example i of the set is example i of the 'eval' stream of `seed`, generated in
chunks of CHUNK (`generate_batch(cfg, seed, i // CHUNK, CHUNK, 'eval')`), so a
smaller set is a prefix of a larger one. D− of corruption c uses the key
`corruption_key(seed, c)` (row keys fold in the example id).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from ceu_jax.data import atr, corruptions as corr, tasks, tfds_local
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import RetrievalBatch

CHUNK = 1024          # generation chunk (examples per jitted call)
SPLIT = "eval"
MINUS_FIELDS = ("context", "changed_mask", "has_evidence", "line_kind", "distractor_mask",
                "hard_negative_mask")
EvalSet = tuple[RetrievalBatch, dict[str, RetrievalBatch]]


# ------------------------------------------------------------------ keys
def _as_atr_config(cfg: ATRConfig | Mapping[str, Any]) -> ATRConfig:
  return cfg if isinstance(cfg, ATRConfig) else ATRConfig.from_config(cfg)


def _check_args(seed: int, num_examples: int, names: Sequence[str]) -> tuple[str, ...]:
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"eval set seed must be an integer >= 0, got {seed!r}")
  if not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
    raise ValueError(f"eval set num_examples must be an integer >= 1, got {num_examples!r}")
  names = tuple(names)
  for name in names:
    if name not in corr.CORRUPTIONS:
      raise ValueError(f"corruption must be one of {corr.CORRUPTIONS}, got {name!r}")
  if len(set(names)) != len(names):
    raise ValueError(f"corruptions must be distinct, got {names}")
  return names


def set_key(cfg: ATRConfig, seed: int, num_examples: int, names: Sequence[str]) -> dict:
  """The JSON-able identity of an evaluation set."""
  versions = {n: corr.VERSIONS[n] for n in names if n in corr.VERSIONS}
  return dict(atr_config=dataclasses.asdict(cfg), seed=int(seed),
              num_examples=int(num_examples), corruptions=list(names), chunk=CHUNK,
              format=FORMAT_VERSION, generator=atr.GENERATOR_VERSION,
              **({"corruption_versions": versions} if versions else {}))


def config_name(key: Mapping[str, Any]) -> str:
  """Stable builder-config name: a hash of the canonical JSON of `set_key`."""
  blob = json.dumps(key, sort_keys=True, separators=(",", ":")).encode()
  return "cfg_" + hashlib.sha256(blob).hexdigest()[:20]


def corruption_key(seed: int, name: str) -> jax.Array:
  """PRNG key of corruption `name` in the evaluation set of `seed`."""
  base = jax.random.fold_in(jax.random.PRNGKey(seed), 0x0E7A)
  return jax.random.fold_in(base, np.uint32(zlib.crc32(name.encode())))


# ------------------------------------------------------------------ generation
def _to_numpy(tree):
  return jax.tree.map(np.asarray, tree)


def _concat(parts: list, num: int):
  return jax.tree.map(lambda *xs: np.concatenate(xs)[:num], *parts)


def eval_batches(cfg: ATRConfig | Mapping[str, Any], seed: int, num_examples: int,
                 corruptions: Sequence[str], split: str = SPLIT) -> EvalSet:
  """The ATR-insert evaluation set in memory (numpy): (D+, {name: D−})."""
  return _generate(tasks.get("atr_insert"), _as_atr_config(cfg), split, seed, num_examples,
                   _check_args(seed, num_examples, corruptions))


def _generate(spec: tasks.TaskSpec, cfg: Any, split: str, seed: int, num_examples: int,
              names: Sequence[str]) -> EvalSet:
  # ATR-insert's examples depend on the chunk they are generated in (CHUNK);
  # factual QA's on their position alone, so one call generates them all.
  chunk = CHUNK if spec.name == "atr_insert" else num_examples
  plus_parts: list = []
  minus_parts: dict[str, list] = {name: [] for name in names}
  for index in range(-(-num_examples // chunk)):
    plus = spec.generate_batch(cfg, seed, index, chunk, split)
    plus_parts.append(_to_numpy(plus))
    for name in names:
      minus = spec.corrupt(cfg, plus, name, corruption_key(seed, name))
      minus_parts[name].append(_to_numpy(minus))
  return (_concat(plus_parts, num_examples),
          {name: _concat(parts, num_examples) for name, parts in minus_parts.items()})


# ------------------------------------------------------------------ any task
@dataclasses.dataclass(frozen=True)
class FixedEvalSet:
  """A fixed evaluation set: D+, D− per corruption, and what identifies it."""
  clean: RetrievalBatch                    # D+ (numpy arrays)
  corrupt: Mapping[str, RetrievalBatch]    # corruption name -> token-aligned D−
  identity: Mapping[str, Any]              # JSON: task, data, split, seed, size, corruptions,
                                           # generator version, digest of the arrays

  @property
  def num_examples(self) -> int:
    return int(self.clean.context.shape[0])

  @property
  def corruptions(self) -> tuple[str, ...]:
    return tuple(self.corrupt)

  def select(self, corruptions: Sequence[str]) -> "FixedEvalSet":
    """The same examples with only some corruptions (identity keeps the digest)."""
    missing = [c for c in corruptions if c not in self.corrupt]
    if missing:
      raise ValueError(f"eval set has no corruption {missing[0]!r}; it has {self.corruptions}")
    return dataclasses.replace(
        self, corrupt={c: self.corrupt[c] for c in corruptions},
        identity={**self.identity, "corruptions": list(corruptions)})


def digest(tree: Any) -> str:
  """Short sha1 of every array leaf (shape, dtype and bytes)."""
  h = hashlib.sha1()
  for leaf in jax.tree_util.tree_leaves(tree):
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{a.shape}{a.dtype}".encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def fixed_eval_set(task: str, data_cfg: Any, *, seed: int, num_examples: int,
                   corruptions: Sequence[str], split: str = SPLIT,
                   data_dir: str | os.PathLike | None = None) -> FixedEvalSet:
  """THE evaluation set of (task, data config, split, seed, size, corruptions).

  `data_dir` (ATR-insert, split 'eval'): read from / build the materialised tfds
  set there; otherwise generated in memory (identical arrays, tested)."""
  spec = tasks.get(task)
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"eval.seed must be an integer >= 0, got {seed!r}")
  if not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
    raise ValueError(f"eval.num_examples must be an integer >= 1, got {num_examples!r}")
  names = tuple(corruptions)
  bad = [c for c in names if c not in spec.corruptions]
  if bad or not names or len(set(names)) != len(names):
    raise ValueError(f"eval.corruptions must be distinct names from {spec.corruptions} for "
                     f"data.task {task!r}, got {names}")
  if task == "atr_insert" and split == SPLIT and data_dir is not None:
    clean, minus = load_eval_set(data_cfg, seed, num_examples, names, data_dir)
  else:
    clean, minus = _generate(spec, data_cfg, split, int(seed), int(num_examples), names)
  key = dict(task=task, data=json.loads(json.dumps(dataclasses.asdict(data_cfg), default=str)),
             split=split, seed=int(seed), num_examples=int(num_examples),
             corruptions=list(names), chunk=CHUNK if task == "atr_insert" else None,
             generator=atr.GENERATOR_VERSION if task == "atr_insert" else None)
  return FixedEvalSet(clean, minus, {**key, "digest": digest((clean, minus))})


# ------------------------------------------------------------------ tfds builder
# tensorflow_datasets is imported when a set is first built or read (0.13-0.18 s of a
# process's start otherwise, also for runs that never touch a fixed set).
FORMAT_VERSION = "1.0.0"   # the builder's tfds VERSION, part of every set's key


def _tensor(shape: tuple[int, ...], dtype) -> "tfds.features.Tensor":
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds.features.Tensor(shape=shape, dtype=dtype)


def _plus_features(cfg: ATRConfig) -> dict:
  n, lines = cfg.context_len, cfg.num_lines
  i32, b = np.int32, np.bool_
  return dict(query=_tensor((cfg.query_len,), i32), context=_tensor((n,), i32),
              passage_ids=_tensor((n,), i32), answer=_tensor((cfg.answer_len,), i32),
              has_evidence=_tensor((), b), evidence_mask=_tensor((n,), b),
              value_mask=_tensor((n,), b), distractor_mask=_tensor((n,), b),
              hard_negative_mask=_tensor((n,), b), passage_start=_tensor((n,), b),
              line_ids=_tensor((n,), i32), line_kind=_tensor((lines,), i32),
              changed_mask=_tensor((n,), b), example_id=_tensor((), i32))


@functools.lru_cache(maxsize=None)
def builder_class() -> type:
  """`AtrEvalSet`, the tfds builder of one fixed ATR-insert evaluation set."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class AtrEvalSet(tfds.core.GeneratorBasedBuilder):
    """One fixed ATR-insert evaluation set (split 'eval'), keyed by its config name."""

    VERSION = tfds.core.Version(FORMAT_VERSION)
    RELEASE_NOTES = {"1.0.0": "D+ fields and each corruption's D− fields."}
    # No checksums file / code directory: tfds would otherwise resolve the package
    # path through importlib_resources, which it does not install on Python >= 3.9.
    code_path = None

    def __init__(self, *, atr_config: ATRConfig, seed: int, num_examples: int,
                 corruptions: Sequence[str], **kwargs):
      self._atr = atr_config
      self._names = _check_args(seed, num_examples, corruptions)
      self._seed, self._num = int(seed), int(num_examples)
      self._key = set_key(atr_config, seed, num_examples, self._names)
      config = tfds.core.BuilderConfig(name=config_name(self._key),
                                       description=json.dumps(self._key, sort_keys=True))
      super().__init__(config=config, file_format="array_record", **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
      plus = _plus_features(self._atr)
      minus = {name: {f: plus[f] for f in MINUS_FIELDS} for name in self._names}
      return tfds_local.local_dataset_info(
          builder=self, description="Fixed ATR-insert evaluation set (ceu-jax).",
          features=tfds.features.FeaturesDict(dict(plus=plus, minus=minus)),
          disable_shuffling=True,
          metadata=tfds.core.MetadataDict(set_key=json.dumps(self._key, sort_keys=True)))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {SPLIT: self._generate_examples()}

    def _generate_examples(self):
      plus, minus = eval_batches(self._atr, self._seed, self._num, self._names)
      for r in range(self._num):
        yield r, dict(plus={f: getattr(plus, f)[r] for f in plus.__dataclass_fields__},
                      minus={name: {f: getattr(b, f)[r] for f in MINUS_FIELDS}
                             for name, b in minus.items()})

  AtrEvalSet.__module__ = __name__
  AtrEvalSet.__qualname__ = "AtrEvalSet"
  return AtrEvalSet


# ------------------------------------------------------------------ load / build
def _builder(cfg, seed, num_examples, names, data_dir):
  """The `builder_class()` instance of one set under data_dir."""
  return builder_class()(atr_config=cfg, seed=seed, num_examples=num_examples,
                    corruptions=names, data_dir=os.fspath(data_dir))


def _build_atomically(cfg, seed, num_examples, names, data_dir: Path) -> None:
  """Build into data_dir/.tmp-*, then os.replace the config directory into place."""
  data_dir.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=".tmp-atr_eval_set-", dir=data_dir))
  try:
    builder = _builder(cfg, seed, num_examples, names, tmp)
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    tfds.display_progress_bar(False)
    builder.download_and_prepare()
    rel = Path(builder.data_dir).parent.relative_to(tmp)     # atr_eval_set/cfg_<hash>
    (data_dir / rel.parent).mkdir(parents=True, exist_ok=True)
    try:
      os.replace(tmp / rel, data_dir / rel)
    except OSError:
      if not (data_dir / rel).is_dir():   # not a concurrent build that won the race
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _read(builder, num_examples: int, names: Sequence[str]) -> EvalSet:
  source = builder.as_data_source()[SPLIT]
  if len(source) != num_examples:
    raise ValueError(f"eval set {builder.data_dir} holds {len(source)} examples, "
                     f"expected {num_examples}")
  items = source.__getitems__(list(range(num_examples)))
  dtypes = {f: feature.np_dtype for f, feature in _plus_features(builder._atr).items()}

  def stack(field, get):   # scalars come back as Python ints: restore the dtype
    return np.stack([get(item) for item in items]).astype(dtypes[field])

  plus = RetrievalBatch(**{f: stack(f, lambda it, f=f: it["plus"][f])
                           for f in RetrievalBatch.__dataclass_fields__})
  minus = {name: plus.replace(**{f: stack(f, lambda it, f=f: it["minus"][name][f])
                                 for f in MINUS_FIELDS})
           for name in names}
  return plus, minus


def load_eval_set(cfg: ATRConfig | Mapping[str, Any], seed: int, num_examples: int,
                  corruptions: Sequence[str], data_dir: str | os.PathLike) -> EvalSet:
  """(D+, {name: D−}) of the fixed evaluation set; built on first use, then reused.

  `cfg` is an ATRConfig or a config's data section. Arrays are numpy; example r
  equals row r of `eval_batches(cfg, seed, num_examples, corruptions)`.
  """
  cfg = _as_atr_config(cfg)
  names = _check_args(seed, num_examples, corruptions)
  data_dir = Path(data_dir)
  builder = _builder(cfg, seed, num_examples, names, data_dir)
  if not builder.is_prepared():
    _build_atomically(cfg, seed, num_examples, names, data_dir)
    builder = _builder(cfg, seed, num_examples, names, data_dir)
  stored = builder.info.metadata.get("set_key") if builder.info.metadata else None
  if stored is not None and json.loads(stored) != builder._key:
    raise ValueError(f"eval set at {builder.data_dir} was built for another key: {stored}")
  return _read(builder, num_examples, names)
