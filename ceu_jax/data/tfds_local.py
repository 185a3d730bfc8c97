"""DatasetInfo for datasets generated on this machine (the ATR eval sets, factqa).

tensorflow_datasets, when a builder is constructed over a directory that holds no prepared
dataset yet, calls `DatasetInfo.initialize_from_bucket()` to look for pre-computed info in
its public GCS bucket. With GCS off (tfds' default here) it finds nothing, but it has
already made a `tempfile.mkdtemp('tfds')` directory and never removes it: one empty
`/tmp/tmp*tfds` per builder construction (two per eval set built, hundreds over a test
session or a grid). Our datasets are generated here and have no bucket entry, so the
lookup is skipped.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def local_dataset_info_class():
  """`tfds.core.DatasetInfo` without the bucket lookup (tfds imported on first use)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  class LocalDatasetInfo(tfds.core.DatasetInfo):
    """Info of a dataset generated locally: never looked up in the GCS bucket."""

    def initialize_from_bucket(self) -> None:
      """No pre-computed info exists outside this machine (and tfds' lookup leaks a
      temporary directory)."""

  return LocalDatasetInfo


def local_dataset_info(**kwargs):
  """`tfds.core.DatasetInfo(**kwargs)` for a dataset generated here."""
  return local_dataset_info_class()(**kwargs)
