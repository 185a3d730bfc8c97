"""The project's dependency rules, checked on the source (anyone can rerun them).

- the engine knows only Flax/JAX: no import of architectures/, training, the
  audit job, grids or experiments;
- training imports no file or plot module (the audit job, plotting, matplotlib)
  and importing `ceu_jax.train` does not import matplotlib;
- no library module imports `experiments`; every `experiments/*.py` entry point runs
  through `cli.run`;
- the pretrained package runs its audits through the engine;
- a retrieval model is built from a config in one place (`ceu_jax.auditor`), and
  ceu_jax/, experiments/ and benchmarks/ build models only by `architectures.build_model`;
- architectures/: the context-encoder prologue is built in one module, `read` is
  defined once (the read-port base).
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
  # Nor orbax: an entry point that stops on bad input or never checkpoints does not pay
  # its import (ceu_jax.train.checkpoint imports it where a checkpoint is made or read).
  code = ("import sys, experiments.train; loaded = [m for m in ('matplotlib', "
          "'orbax.checkpoint') if m in sys.modules]; assert not loaded, loaded")
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


# Architectures (issue #14 items 5 and 7) ----------------------------------------------

def _called(path: pathlib.Path) -> set[str]:
  """Names of everything a file calls (`f(...)` gives f, `a.f(...)` gives f)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Call):
      f = node.func
      out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
  return out


def test_the_context_encoder_prologue_and_the_read_method_exist_once():
  """One module builds the encoder prologue (its query conditioning and encoder blocks),
  one module (model.py) instantiates it, the encoders write the one memory structure, and
  the read-port method `read` (span-mask check, activation constraint) is defined once."""
  where: dict[str, list[str]] = {}
  reads = []
  for f in _files("architectures"):
    rel = str(f.relative_to(ROOT))
    called = _called(f)
    for name in ("QueryFilm", "TransformerBlock", "ContextPrologue", "ContextMemory",
                 "check_span_mask"):
      if name in called:
        where.setdefault(name, []).append(rel)
    tree = ast.parse(f.read_text())
    reads += [rel for node in ast.walk(tree)
              if isinstance(node, ast.FunctionDef) and node.name == "read"]
  assert where == {"QueryFilm": ["architectures/prologue.py"],
                   "TransformerBlock": ["architectures/prologue.py"],
                   "ContextPrologue": ["architectures/model.py"],
                   "ContextMemory": ["architectures/prologue.py", "architectures/ssm.py"],
                   "check_span_mask": ["architectures/port.py"]}, where
  assert reads == ["architectures/port.py"], reads


def test_models_are_built_only_by_architectures_build_model():
  """ceu_jax/, experiments/ and benchmarks/ use `architectures` only through its public
  API, which exports no module class: `architectures.build_model` is the one
  model-building call (in the library only the auditor makes it: the test above)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import architectures  # pylint: disable=g-import-not-at-top
  public = set(architectures.__all__)
  modules = [n for n in public if isinstance(getattr(architectures, n), type)
             and issubclass(getattr(architectures, n), nn.Module)]
  assert not modules, modules
  bad, builders = [], set()
  for package in ("ceu_jax", "experiments", "benchmarks"):
    for f in _files(package):
      rel = str(f.relative_to(ROOT))
      for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
          bad += [f"{rel}: import {a.name}" for a in node.names
                  if a.name.startswith("architectures.")
                  or (a.name == "architectures" and a.asname not in (None, "architectures"))]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
            node.module == "architectures" or node.module.startswith("architectures.")):
          bad += [f"{rel}: from {node.module} import {a.name}" for a in node.names
                  if node.module != "architectures" or a.name not in public]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "architectures"):
          if node.attr not in public:
            bad.append(f"{rel}: architectures.{node.attr}")
          if node.attr == "build_model":
            builders.add(rel.split("/")[0])
  assert not bad, bad
  assert "ceu_jax" in builders, builders  # the scan sees the library's build_model call


# ---------------------------------------------------------------- the import graph
_PACKAGES = ("ceu_jax", "architectures", "configs")


def _modules(packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every module of `packages`."""
  mods = {}
  for pkg in packages:
    for f in _files(pkg):
      name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
      mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = f
  return mods


def _module_graph() -> dict[str, set[str]]:
  """Module -> the project modules it imports anywhere in its body (function-level
  imports too: a cycle hidden inside a function is still a cycle). Imports of a
  module's own parent packages (their __init__) are not edges."""
  mods = _modules(_PACKAGES)

  def resolve(name: str) -> str | None:
    while name and name not in mods:
      name = name.rsplit(".", 1)[0] if "." in name else ""
    return name or None
  graph = {m: set() for m in mods}
  for m, f in mods.items():
    for name in _imports(f):
      r = resolve(name)
      if r and r != m and not m.startswith(r + "."):
        graph[m].add(r)
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one node (Tarjan, iterative)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
  for root in graph:
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter[0]
    counter[0] += 1
    stack.append(root)
    on.add(root)
    while work:
      v, it = work[-1]
      w = next(it, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = counter[0]
          counter[0] += 1
          stack.append(w)
          on.add(w)
          work.append((w, iter(sorted(graph[w]))))
        elif w in on:
          low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[v])
      if low[v] == index[v]:
        comp = []
        while True:
          x = stack.pop()
          on.discard(x)
          comp.append(x)
          if x == v:
            break
        if len(comp) > 1:
          out.append(sorted(comp))
  return out


def _package_of(module: str) -> str:
  parts = module.split(".")
  if parts[0] != "ceu_jax":
    return parts[0]
  return ".".join(parts[:2]) if len(parts) > 1 and (ROOT / "ceu_jax" / parts[1]).is_dir() \
      else module


def test_no_import_cycles_between_modules_or_packages():
  graph = _module_graph()
  assert _cycles(graph) == []
  packages: dict[str, set[str]] = {}
  for m, deps in graph.items():
    a = _package_of(m)
    packages.setdefault(a, set()).update(b for b in map(_package_of, deps) if b != a)
  assert _cycles(packages) == []


def test_cycle_finder_finds_a_planted_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_library_never_imports_configs():
  for package in ("ceu_jax", "architectures"):
    assert not _violations(package, ("configs",)), package


def test_no_private_name_crosses_a_module():
  """`from m import _x` and `m._x` of another project module (a private name is its
  module's own: make it public or move the code next to its user)."""
  graph_mods = _modules(_PACKAGES + ("experiments", "benchmarks"))
  private = lambda n: n.startswith("_") and not n.startswith("__")
  bad = []
  for me, f in graph_mods.items():
    tree = ast.parse(f.read_text())
    aliases = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for a in node.names:
          if f"{node.module}.{a.name}" in graph_mods:
            aliases[a.asname or a.name] = f"{node.module}.{a.name}"
          elif node.module in graph_mods and node.module != me and private(a.name):
            bad.append(f"{me}: from {node.module} import {a.name}")
      elif isinstance(node, ast.Import):
        aliases.update({a.asname or a.name: a.name for a in node.names if a.name in graph_mods})
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and private(node.attr)
          and isinstance(node.value, ast.Name) and aliases.get(node.value.id, me) != me):
        bad.append(f"{me}: {aliases[node.value.id]}.{node.attr}")
  assert not bad, bad


def test_every_entry_point_runs_through_cli_run():
  """Issue #34.1: every `experiments/*.py` entry point starts by `cli.run(main)` (one-line
  errors, quiet logs), none by absl's `app.run` directly."""
  bad = []
  for f in sorted((ROOT / "experiments").glob("*.py")):
    tree = ast.parse(f.read_text(), str(f))
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    if f.name == "__init__.py":
      continue
    calls = {ast.unparse(c.func) for m in mains for c in ast.walk(m) if isinstance(c, ast.Call)}
    if "cli.run" not in calls or "app.run" in calls:
      bad.append(f"{f.name}: {sorted(calls) or 'no __main__ block'}")
  assert not bad, bad
