"""Prepare the factual-QA benchmark shipped in ceu_jax/data/factqa/shipped/.

  python scripts/prepare_factqa.py [--work-dir /tmp/ceu_factqa_work] [--out DIR]

Downloads the bigbench 1.0.0 sdist with `pip download --no-deps` (about 360 MB, into
the work dir, never into the repo), extracts SQuAD v1.1 dev and the NQ
knowledge-conflict task, keeps short extractive single-hop entity answers, restores
the original NQ passages, locates evidence clauses, trains the BPE tokenizer and
writes gzipped JSONL + MANIFEST.json. Re-running rewrites the same bytes.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from ceu_jax.data.factqa import prepare, storage, tokenizer  # noqa: E402

SDIST = "bigbench==1.0.0"
MEMBERS = {  # file name in the work dir -> (path inside the sdist, sha256)
    "squaddev_v1.1.json": (
        "bigbench/benchmark_tasks/squad_shifts/squaddev_v1.1.json",
        "45089eff3cf52004b1dca6814cde5c57082fdb09872f18c79a5d944d45be523a"),
    "nq_conflicts_task.json": (
        "bigbench/benchmark_tasks/contextual_parametric_knowledge_conflicts/task.json",
        "c8b4a4528d3530181881851f9e145d175ff41463d2742f3c73300b5c566d295a"),
}
SAMPLE_FILE = "sample_raw.json.gz"


def _sha(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _have_raw(raw: pathlib.Path) -> bool:
  return all((raw / n).is_file() and _sha(raw / n) == h for n, (_, h) in MEMBERS.items())


def fetch_raw(work: pathlib.Path) -> pathlib.Path:
  """The two raw files, verified by sha256; downloads the sdist if they are not cached."""
  raw = work / "raw"
  if _have_raw(raw):
    return raw
  raw.mkdir(parents=True, exist_ok=True)
  dl, tmp = work / "sdist", work / "tmp"
  tmp.mkdir(parents=True, exist_ok=True)
  # bigbench's metadata declares a file:// dependency that makes pip refuse the sdist
  # after downloading and unpacking it; --no-clean keeps the unpacked tree in TMPDIR.
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--no-clean", SDIST, "-d", str(dl)]
  print("running:", " ".join(cmd), flush=True)
  subprocess.run(cmd, env={**os.environ, "TMPDIR": str(tmp)}, check=False)
  for name, (member, _) in MEMBERS.items():
    _extract(dl, tmp, member, raw / name)
  shutil.rmtree(tmp, ignore_errors=True)
  if not _have_raw(raw):
    raise SystemExit(f"raw files in {raw} do not match the expected sha256")
  return raw


def _extract(dl: pathlib.Path, tmp: pathlib.Path, member: str, dest: pathlib.Path) -> None:
  for sdist in sorted(dl.glob("bigbench-*.tar.gz")):
    with tarfile.open(sdist) as tar:
      for info in tar.getmembers():
        if info.name.endswith("/" + member):
          dest.write_bytes(tar.extractfile(info).read())
          return
  hits = sorted(glob.glob(str(tmp / "pip-*" / "*" / member)))
  if not hits:
    raise SystemExit(f"could not find {member} in the downloaded sdist (see pip output)")
  shutil.copyfile(hits[0], dest)


def raw_sample(squad: dict, nq: dict) -> dict:
  """A small raw sample (CI checks the matcher and writer on it)."""
  articles = [{"title": a["title"], "paragraphs": a["paragraphs"][:4]}
              for a in squad["data"][:2]]
  return {"squad": {"data": articles}, "nq": {"examples": nq["examples"][:120]}}


def build(squad: dict, nq: dict, counts: prepare.Counts):
  """(examples, passages, tokenizer JSON text) from the raw JSON objects."""
  sq_ex, sq_pa = prepare.process_squad(squad, counts)
  nq_ex, nq_pa = prepare.process_nq(nq, counts)
  examples = sorted(sq_ex + nq_ex, key=lambda r: r["id"])
  passages = sorted(sq_pa + nq_pa, key=lambda r: r["id"])
  tok = tokenizer.train(prepare.corpus_lines(examples, passages))
  tok_json = tok.to_str()
  fact_tok = tokenizer.FactTokenizer(tok_json)
  prepare.add_substitutes(examples, {p["id"]: p for p in passages}, fact_tok.n_tokens)
  return examples, passages, tok_json, fact_tok


def summary(examples: list, counts: prepare.Counts, fact_tok) -> dict:
  """Counts for MANIFEST.json and the console."""
  by = lambda key: dict(sorted(_count(examples, key).items()))  # noqa: E731
  equal = sum(1 for r in examples if r.get("swap")
              and fact_tok.n_tokens(r["swap"]) == fact_tok.n_tokens(r["answer"]))
  return {"sources": counts.as_dict(), "splits": by(lambda r: f"{r['source']}/{r['split']}"),
          "answer_types": by(lambda r: f"{r['source']}/{r['answer_type']}"),
          "paraphrase_rules": by(lambda r: r["paraphrase_rule"]),
          "swap_equal_token_length": equal,
          "swap_missing": sum(1 for r in examples if not r.get("swap")),
          "nq_swap_equal_token_length": sum(
              1 for r in examples if r.get("swap_equal")
              and fact_tok.n_tokens(r["swap_equal"]) == fact_tok.n_tokens(r["answer"])),
          "counterfactual_nameable": sum(1 for r in examples if r.get("cf_answer")),
          "vocab_size": fact_tok.vocab_size}


def _count(examples: list, key) -> dict:
  out: dict = {}
  for r in examples:
    out[key(r)] = out.get(key(r), 0) + 1
  return out


def write(out: pathlib.Path, examples, passages, tok_json: str, sample: dict,
          stats: dict) -> None:
  sha = {storage.EXAMPLES_FILE: storage.write_jsonl_gz(out / storage.EXAMPLES_FILE, examples),
         storage.PASSAGES_FILE: storage.write_jsonl_gz(out / storage.PASSAGES_FILE, passages),
         storage.TOKENIZER_FILE: storage.write_bytes(
             out / storage.TOKENIZER_FILE, storage.gzip_bytes(tok_json.encode("utf-8"))),
         SAMPLE_FILE: storage.write_bytes(
             out / SAMPLE_FILE, storage.gzip_bytes(storage.dumps(sample).encode("utf-8")))}
  manifest = {"format": 1, "source_sdist": SDIST,
              "raw_sha256": {n: h for n, (_, h) in MEMBERS.items()},
              "sha256": dict(sorted(sha.items())), "stats": stats}
  (out / storage.MANIFEST_FILE).write_text(
      json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--work-dir", default="/tmp/ceu_factqa_work",
                  help="download / extraction dir (outside the repo)")
  ap.add_argument("--out", default=str(storage.SHIPPED_DIR), help="output dir")
  args = ap.parse_args(argv)
  os.environ.setdefault("RAYON_NUM_THREADS", "2")
  raw = fetch_raw(pathlib.Path(args.work_dir))
  squad = json.loads((raw / "squaddev_v1.1.json").read_text("utf-8"))
  nq = json.loads((raw / "nq_conflicts_task.json").read_text("utf-8"))
  counts = prepare.Counts()
  examples, passages, tok_json, fact_tok = build(squad, nq, counts)
  stats = summary(examples, counts, fact_tok)
  write(pathlib.Path(args.out), examples, passages, tok_json, raw_sample(squad, nq), stats)
  print(json.dumps(stats, indent=1))


if __name__ == "__main__":
  main()
