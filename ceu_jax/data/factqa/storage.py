"""The shipped factual-QA files: deterministic gzipped JSONL, a manifest, clear errors.

The source of truth is `shipped/` (gzipped JSONL + the tokenizer JSON, each listed
with its sha256 in `MANIFEST.json`). Gzip is written with mtime 0 and no file name,
JSON with sorted keys, so re-running the preparation rewrites identical bytes.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import pathlib
from typing import Any, Iterable, Iterator

SHIPPED_DIR = pathlib.Path(__file__).resolve().parent / "shipped"
EXAMPLES_FILE = "examples.jsonl.gz"
PASSAGES_FILE = "passages.jsonl.gz"
TOKENIZER_FILE = "tokenizer.json.gz"
MANIFEST_FILE = "MANIFEST.json"
DATA_FILES = (EXAMPLES_FILE, PASSAGES_FILE, TOKENIZER_FILE)
REGENERATE = "python scripts/prepare_factqa.py"


class FactQADataError(RuntimeError):
  """A shipped factual-QA file is missing or damaged."""


def _fail(path: pathlib.Path, what: str) -> FactQADataError:
  return FactQADataError(
      f"factqa data file {path} is {what}. Regenerate the shipped data with "
      f"`{REGENERATE}` (it downloads the bigbench 1.0.0 sdist once), or restore it "
      f"with `git checkout -- {path.parent}`.")


def dumps(record: dict[str, Any]) -> str:
  """Canonical one-line JSON (sorted keys, UTF-8, no spaces)."""
  return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def gzip_bytes(data: bytes) -> bytes:
  """Deterministic gzip: level 9, mtime 0, no embedded file name."""
  buf = io.BytesIO()
  with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
    f.write(data)
  return buf.getvalue()


def write_jsonl_gz(path: pathlib.Path, records: Iterable[dict[str, Any]]) -> str:
  """Write records as gzipped JSONL; returns the sha256 of the bytes written."""
  data = "".join(dumps(r) + "\n" for r in records).encode("utf-8")
  return write_bytes(path, gzip_bytes(data))


def write_bytes(path: pathlib.Path, data: bytes) -> str:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(data)
  return hashlib.sha256(data).hexdigest()


def sha256_file(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(root: pathlib.Path = SHIPPED_DIR) -> dict[str, Any]:
  path = root / MANIFEST_FILE
  if not path.is_file():
    raise _fail(path, "missing")
  try:
    return json.loads(path.read_text("utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise _fail(path, f"damaged ({e})") from None


def verify(root: pathlib.Path = SHIPPED_DIR) -> dict[str, Any]:
  """Check every data file against the manifest; returns the manifest."""
  manifest = read_manifest(root)
  for name in DATA_FILES:
    path = root / name
    if not path.is_file():
      raise _fail(path, "missing")
    expected = manifest.get("sha256", {}).get(name)
    if expected != sha256_file(path):
      raise _fail(path, "damaged (sha256 does not match MANIFEST.json)")
  return manifest


def read_gz_text(path: pathlib.Path) -> str:
  if not path.is_file():
    raise _fail(path, "missing")
  try:
    return gzip.decompress(path.read_bytes()).decode("utf-8")
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise _fail(path, f"damaged ({e})") from None


def iter_jsonl_gz(path: pathlib.Path) -> Iterator[dict[str, Any]]:
  for i, line in enumerate(read_gz_text(path).splitlines()):
    try:
      yield json.loads(line)
    except ValueError:
      raise _fail(path, f"damaged (line {i + 1} is not JSON)") from None


def read_examples(root: pathlib.Path = SHIPPED_DIR) -> list[dict[str, Any]]:
  return list(iter_jsonl_gz(root / EXAMPLES_FILE))


def read_passages(root: pathlib.Path = SHIPPED_DIR) -> dict[str, dict[str, Any]]:
  return {p["id"]: p for p in iter_jsonl_gz(root / PASSAGES_FILE)}
