"""A tfds `GeneratorBasedBuilder` (array_record) built locally from the shipped JSONL.

The shipped gzipped JSONL is the source of truth (it is byte-reproducible; tfds
metadata is not guaranteed to be). On first use the builder writes array_record
files into a cache dir keyed by the shipped files' sha256, under a file lock;
reading goes through `builder.as_data_source()` and needs no TensorFlow.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pathlib
from typing import Any, Iterator, Optional

from ceu_jax.data import tfds_local
from ceu_jax.data.factqa import storage

SPLITS = ("train", "validation", "test")
CACHE_ENV = "CEU_JAX_FACTQA_CACHE"


def default_cache_dir() -> pathlib.Path:
  """$CEU_JAX_FACTQA_CACHE, else ~/.cache/ceu_jax/factqa."""
  env = os.environ.get(CACHE_ENV)
  return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "ceu_jax" / "factqa"


@functools.lru_cache(maxsize=1)
def _builder_class():
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  class CeuFactqa(tfds.core.GeneratorBasedBuilder):
    """Factual QA with located evidence clauses (SQuAD v1.1 dev + NQ knowledge conflicts)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "SQuAD v1.1 dev + NQ conflicts from bigbench 1.0.0."}
    # No checksums / metadata files next to the code: skip tfds' code-path lookup
    # (it needs the optional `importlib_resources` package for package modules).
    code_path = None

    def __init__(self, *, shipped_dir: pathlib.Path, **kwargs):
      self._shipped_dir = pathlib.Path(shipped_dir)
      super().__init__(**kwargs)

    def _info(self):
      return tfds_local.local_dataset_info(
          builder=self,
          description=__doc__,
          features=tfds.features.FeaturesDict({
              "id": tfds.features.Text(), "source": tfds.features.Text(),
              "question": tfds.features.Text(), "answer": tfds.features.Text(),
              "evidence": tfds.features.Text(), "answer_type": tfds.features.Text(),
              "passage": tfds.features.Sequence(tfds.features.Text()),
              "record": tfds.features.Text(), "index": np.int32}),
          supervised_keys=None,
          homepage="https://github.com/google/BIG-bench",
          license="CC BY-SA 4.0 (SQuAD) / CC BY-SA 3.0 (Natural Questions)")

    def _split_generators(self, dl_manager):
      del dl_manager
      examples = storage.read_examples(self._shipped_dir)
      passages = storage.read_passages(self._shipped_dir)
      return {s: self._generate_examples(examples, passages, s) for s in SPLITS}

    def _generate_examples(self, examples, passages, split):
      rows = [r for r in examples if r["split"] == split]
      for i, rec in enumerate(rows):
        yield rec["id"], {
            "id": rec["id"], "source": rec["source"], "question": rec["question"],
            "answer": rec["answer"], "evidence": rec["evidence"],
            "answer_type": rec["answer_type"],
            "passage": passages[rec["passage_id"]]["sentences"],
            "record": storage.dumps(rec), "index": i}

  return CeuFactqa


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def get_builder(shipped_dir: pathlib.Path = storage.SHIPPED_DIR,
                cache_dir: Optional[pathlib.Path] = None):
  """The prepared tfds builder (built into the cache on first use)."""
  manifest = storage.verify(shipped_dir)
  key = manifest["sha256"][storage.EXAMPLES_FILE][:12] + manifest["sha256"][
      storage.PASSAGES_FILE][:12]
  data_dir = pathlib.Path(cache_dir or default_cache_dir()) / key
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  tfds.disable_progress_bar()
  with _locked(data_dir / ".lock"):   # concurrent first uses build once
    builder = _builder_class()(shipped_dir=shipped_dir, data_dir=str(data_dir),
                               file_format="array_record")
    builder.download_and_prepare()
  return builder


def load_split(split: str, shipped_dir: pathlib.Path = storage.SHIPPED_DIR,
               cache_dir: Optional[pathlib.Path] = None) -> list[dict[str, Any]]:
  """The records of `split` (each with its passage sentences), read via tfds, by index."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  source = get_builder(shipped_dir, cache_dir).as_data_source()[split]
  rows = source.__getitems__(list(range(len(source))))
  out = []
  for row in sorted(rows, key=lambda r: int(r["index"])):
    rec = json.loads(_text(row["record"]))
    rec["passage"] = [_text(s) for s in row["passage"]]
    out.append(rec)
  return out


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)
