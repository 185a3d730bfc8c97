"""Every result records the code that produced it (`ceu_jax.code_version`): the version
and, in a git checkout, the commit and the changed files — checked against git itself
on throwaway repositories, then where it is written (provenance, summaries, grid cells)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

import ceu_jax
from ceu_jax import code_version as cv
from ceu_jax import jobs
from ceu_jax import workdir as wd
from ceu_jax.grid import report, runner

version = cv.code_version.__wrapped__   # uncached: the tests change the repositories


def _git(root, *args) -> str:
  return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                         *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
  root = tmp_path / "checkout"
  root.mkdir()
  _git(root, "init", "-q")
  for i in range(25):
    (root / f"f{i:02d}.txt").write_text("a\n")
  _git(root, "add", ".")
  _git(root, "commit", "-q", "-m", "one")
  return root


def test_a_clean_checkout_gives_its_commit(repo):
  got = version(str(repo))
  assert got == dict(ceu_jax=ceu_jax.__version__, commit=_git(repo, "rev-parse", "HEAD"),
                     dirty=False, changed=[], n_changed=0)
  assert cv.describe(got) == f"ceu_jax {ceu_jax.__version__} at commit {got['commit'][:12]}"


def test_changed_and_untracked_files(repo):
  (repo / "f03.txt").write_text("b\n")
  (repo / "new.txt").write_text("not tracked\n")   # untracked files do not make it dirty
  got = version(str(repo))
  assert (got["dirty"], got["changed"], got["n_changed"]) == (True, ["f03.txt"], 1)
  assert cv.describe(got).endswith("(+ 1 changed files)")
  for i in range(25):
    (repo / f"f{i:02d}.txt").write_text("c\n")
  got = version(str(repo))
  assert got["n_changed"] == 25 and got["changed"] == [f"f{i:02d}.txt" for i in range(20)]
  _git(repo, "commit", "-q", "-am", "two")
  again = version(str(repo))
  assert not again["dirty"] and again["commit"] == _git(repo, "rev-parse", "HEAD")
  assert again["commit"] != got["commit"]


@pytest.mark.parametrize("where", ["inside_another_repo", "no_repo"])
def test_no_commit_outside_a_checkouts_top(repo, tmp_path, where):
  """An installed copy inside some other repository (a venv in a user's project) is not
  that repository's commit; a directory outside any repository has none."""
  d = repo / "site-packages" if where == "inside_another_repo" else tmp_path / "plain"
  d.mkdir()
  assert version(str(d)) == dict(ceu_jax=ceu_jax.__version__, commit=None, dirty=None,
                                 changed=None, n_changed=None)
  assert cv.describe(version(str(d))) == f"ceu_jax {ceu_jax.__version__} outside a git checkout"


def test_no_git_program(repo, monkeypatch):
  def missing(*a, **k):
    raise FileNotFoundError("git")
  monkeypatch.setattr(cv.subprocess, "run", missing)
  assert version(str(repo))["commit"] is None


def test_this_package_matches_git():
  """The package's own checkout, read now (uncached: a commit or an edit made while the
  tests run would change it; `code_version()` keeps what the process started with)."""
  root = cv.package_root()
  got = version(root)
  assert cv.code_version()["ceu_jax"] == got["ceu_jax"]
  if not os.path.isdir(os.path.join(root, ".git")) and not os.path.isfile(
      os.path.join(root, ".git")):
    assert got["commit"] is None
    return
  assert got["commit"] == _git(root, "rev-parse", "HEAD")
  changed = _git(root, "status", "--porcelain", "--untracked-files=no")
  assert got["n_changed"] == len([l for l in changed.splitlines() if l.strip()])


def test_written_into_provenance_and_job_summaries(tmp_path):
  event = wd.record_event(str(tmp_path), "start")
  assert event["code"] == cv.code_version()
  assert wd.history(str(tmp_path))[-1]["code"] == json.loads(json.dumps(cv.code_version()))
  assert jobs.versions()["code"] == cv.code_version()


def test_versions_name_the_libraries_and_the_cpu():
  import jax  # noqa: F401  (imported: its version is listed)
  got = cv.versions()
  assert jobs.versions is cv.versions          # one function for summaries and grid cells
  assert got["jax"] == jax.__version__ and got["code"] == cv.code_version()
  assert isinstance(got["cpu"], str) and got["cpu"] and got["cpu"] != "?"
  if os.path.exists("/proc/cpuinfo"):
    names = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
             if l.startswith("model name")]
    assert not names or got["cpu"] == names[0]
  assert got["cpu_features"] == list(cv.cpu_features())
  assert got["xla_flags"] == os.environ.get("XLA_FLAGS", "")


def test_cpu_features_are_the_isa_flags_of_proc_cpuinfo():
  flags = []
  if os.path.exists("/proc/cpuinfo"):
    for line in open("/proc/cpuinfo"):
      if line.split(":")[0].strip() in ("flags", "Features"):
        flags = line.split(":", 1)[1].split()
        break
  got = cv.cpu_features()
  assert list(got) == sorted(got) and set(got) <= set(flags)
  for isa in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_fp16", "amx_tile", "asimd"):
    assert (isa in got) == (isa in flags), isa          # every vector set that is listed
  for other in ("fpu", "hypervisor", "ht", "tsc", "constant_tsc"):
    assert other not in got                              # nothing XLA does not compile for


def test_cpu_kind_tells_same_named_cpus_apart_by_their_instruction_sets():
  xeon = dict(cpu="Intel(R) Xeon(R) Processor", xla_flags="")
  wide = cv.cpu_kind(dict(xeon, cpu_features=["avx", "avx2", "avx512f", "amx_tile", "fma"]))
  narrow = cv.cpu_kind(dict(xeon, cpu_features=["avx", "avx2", "fma"]))
  assert wide.startswith("Intel(R) Xeon(R) Processor [AVX-512 + AMX, 5 ISA flags #")
  assert narrow.startswith("Intel(R) Xeon(R) Processor [AVX2, 3 ISA flags #")
  assert wide != narrow
  capped = cv.cpu_kind(dict(xeon, cpu_features=["avx", "avx2", "fma"],
                            xla_flags="--xla_force_host_platform_device_count=8 "
                                      "--xla_cpu_max_isa=AVX"))
  assert capped.startswith(narrow[:-1]) and capped.endswith(", XLA capped at AVX]")
  assert cv.cpu_kind(dict(cpu="AMD EPYC")) == "AMD EPYC"    # recorded before the features
  assert cv.cpu_kind({}) == cv.cpu_kind(dict(cpu_features=[])) == "unrecorded CPU"
  assert cv.cpu_kind() == cv.cpu_kind(cv.versions())


def test_grid_cells_record_it_and_the_report_names_it(tmp_path):
  from tests.test_grid_driver import base_config, fake_cell
  runner.run_grid(base_config(), str(tmp_path), fake_cell, log=lambda s: None)
  results, _ = runner.load_results(str(tmp_path))
  assert results and all(r["code"] == json.loads(json.dumps(cv.code_version()))
                         for r in results)
  # and the libraries and the CPU: XLA:CPU rounds differently on another CPU
  assert all(r["versions"] == json.loads(json.dumps(cv.versions())) for r in results)
  assert report.code_lines(results) == [
      f"Code: {cv.describe(cv.code_version())} (every cell).", ""]
  assert report.cpu_lines(results) == [f"CPU: {cv.cpu_kind()} (every cell).", ""]
  cpus = report.cpu_lines([{"versions": {"cpu": "AMD EPYC"}}, {"versions": {"cpu": "Xeon"}},
                           {"versions": {"cpu": "AMD EPYC"}}, {"versions": None}, {}])
  assert cpus[0].startswith("**The cells were computed on 3 kinds of CPU**") and cpus[0].endswith(
      "AMD EPYC (2 cells); unrecorded CPU (2 cells); Xeon (1 cells)."), cpus
  assert report.cpu_lines([]) == []
  a = dict(ceu_jax="0.1.0", commit="a" * 40, dirty=False, n_changed=0)
  b = dict(a, commit="b" * 40, dirty=True, n_changed=3)
  mixed = report.code_lines([{"code": a}, {"code": b}, {"code": a}, {}])
  assert mixed[0] == ("**The cells come from 3 code versions** (compare them with care): "
                      f"ceu_jax 0.1.0 at commit {'a' * 12} (2 cells); "
                      f"ceu_jax 0.1.0 at commit {'b' * 12} (+ 3 changed files) (1 cells); "
                      "unrecorded code (1 cells).")
