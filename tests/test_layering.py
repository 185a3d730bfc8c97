"""The project's dependency rules, checked on the source (anyone can rerun them).

- the engine knows only Flax/JAX: no import of architectures/, training, the
  audit job, grids or experiments;
- training imports no file or plot module (the audit job, plotting, matplotlib)
  and importing `ceu_jax.train` does not import matplotlib;
- no library module imports `experiments`;
- the pretrained package runs its audits through the engine;
- a retrieval model is built from a config in one place (`ceu_jax.auditor`).
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports(path: pathlib.Path) -> set[str]:
  """Every module a file imports (absolute names; `from a import b` gives a and a.b)."""
  tree = ast.parse(path.read_text(), str(path))
  out: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out.add(node.module)
      out.update(f"{node.module}.{a.name}" for a in node.names)
  return out


def _files(package: str) -> list[pathlib.Path]:
  return sorted((ROOT / package).rglob("*.py"))


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
  bad = []
  for f in _files(package):
    for name in _imports(f):
      if any(name == p or name.startswith(p + ".") for p in forbidden):
        bad.append(f"{f.relative_to(ROOT)} imports {name}")
  return bad


def test_engine_knows_only_flax_and_jax():
  assert not _violations("ceu_jax/engine", (
      "architectures", "ceu_jax.train", "ceu_jax.audit_job", "ceu_jax.auditor",
      "ceu_jax.grid", "ceu_jax.theory", "ceu_jax.pretrained", "ceu_jax.data", "experiments",
      "matplotlib"))


def test_training_imports_no_file_or_plot_module():
  assert not _violations("ceu_jax/train", (
      "ceu_jax.audit_job", "ceu_jax.plotting", "matplotlib", "ceu_jax.grid", "experiments"))
  code = "import sys, ceu_jax.train; assert 'matplotlib' not in sys.modules, 'matplotlib'"
  subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_library_never_imports_experiments():
  for package in ("ceu_jax", "architectures", "configs"):
    assert not _violations(package, ("experiments",)), package


def test_models_know_nothing_of_training_or_grids():
  assert not _violations("architectures", (
      "ceu_jax.train", "ceu_jax.grid", "ceu_jax.audit_job", "ceu_jax.auditor", "experiments"))


def test_pretrained_audit_goes_through_the_engine():
  names = set().union(*(_imports(f) for f in _files("ceu_jax/pretrained")))
  assert any(n == "ceu_jax.engine" or n.startswith("ceu_jax.engine.") for n in names)


def test_one_place_builds_the_retrieval_model_from_a_config():
  calls = []
  for package in ("ceu_jax", "experiments"):
    for f in _files(package):
      for node in ast.walk(ast.parse(f.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "build_model"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "architectures"):
          calls.append(str(f.relative_to(ROOT)))
  assert calls == ["ceu_jax/auditor.py"], calls
