"""Strict config arguments (issue #13 acceptance 7) and the entry points' one-line
errors and quiet logs (acceptance 5)."""
from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys

import ml_collections
import pytest

from ceu_jax import cli
from configs import atr_insert, common, factqa, smoke

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("arg,match", [
    ("tiny,bypass=treu", r"bypass='treu' is not allowed: bypass must be one of true, yes, 1, "
                         r"false, no, 0"),
    ("tiny,context_len=0", r"context_len must be an integer >= 1"),
    ("tiny,steps=0", r"steps must be an integer >= 1"),
    ("tiny,steps=2.5", r"steps must be an integer >= 1"),
    ("tiny,rho=1.5", r"rho must be a number >= 0.0 and <= 1.0"),
    ("tiny,delta=nan", r"delta must be a number"),
    ("tiny,seed=-1", r"seed must be an integer >= 0"),
    ("tiny,family=transformer", r"family must be one of attention, ssm, memory_port"),
    ("tiny,preset=p1m", r"preset must be one of p100k, p400k, p1500k"),
    ("tiny,steps=3,steps=4", r"'steps' is given twice"),
    ("tiny,nope=1", r"'nope' is unknown"),
])
def test_bad_config_arguments_are_errors(arg, match):
  with pytest.raises(ValueError, match=match):
    atr_insert.get_config(arg)


def test_config_arguments_parse_and_defaults_are_the_variants():
  c = atr_insert.get_config("tiny,bypass=TRUE,context_len=64,steps=7,rho=0.5,family=ssm")
  assert (c.model.bypass, c.data.context_len, c.train.num_steps, c.data.rho,
          c.model.family) == (True, 64, 7, 0.5, "ssm")
  c = atr_insert.get_config("tiny,bypass=no")
  assert (c.model.bypass, c.data.context_len, c.train.num_steps, c.model.preset) == (
      False, 128, 3000, "p100k")
  assert atr_insert.get_config("base").data.context_len == 512
  f = factqa.get_config("tiny,family=ssm,steps=5,sources=squad")
  assert (f.model.family, f.train.num_steps, f.data.sources) == ("ssm", 5, ("squad",))
  assert factqa.get_config("tiny").train.num_steps == 1000
  with pytest.raises(ValueError, match="counterfactual"):
    factqa.get_config("tiny,counterfactual=maybe")
  assert smoke.get_config("tiny,steps=3").train.num_steps == 3
  with pytest.raises(ValueError, match="steps must be an integer >= 1"):
    smoke.get_config("tiny,steps=0")


def test_plain_defaults_keep_their_type():
  a = common.parse_arg("x=3,y=0.5,z=yes,w=abc", x=1, y=0.0, z=False, w="")
  assert (a.x, a.y, a.z, a.w) == (3, 0.5, True, "abc")
  with pytest.raises(ValueError, match="x must be an integer"):
    common.parse_arg("x=3.5", x=1)


def test_smoke_tiny_crosses_family_and_regulariser():
  from ceu_jax.grid import sweep
  cells = sweep.expand(smoke.get_config("tiny"))
  got = {(c.config.model.family, c.config.cer.regularizer, c.config.cer.lambda_ev)
         for c in cells}
  assert got == {(f, r, lam) for f in ("attention", "memory_port")
                 for r, lam in (("none", 0.0), ("evidence", 1.0))}


def test_smoke_worlds_and_seeds_expand_as_documented():
  from ceu_jax.grid import sweep
  cells = sweep.expand(smoke.get_config("full,world=both,seeds=2"))
  got = {(c.config.model.family, c.config.cer.regularizer, c.config.data.rho,
          c.config.data.eta, c.config.seed) for c in cells}
  assert len(cells) == len(got) == 3 * 3 * 2 * 2
  assert {(r, e) for *_, r, e, _ in got} == {(0.3, 0.0), (0.9, 0.3)}
  assert {s for *_, s in got} == {0, 1}
  assert {g[1] for g in got} == {"none", "evidence", "evidence_distractor"}
  short = smoke.get_config("tiny,world=shortcut")
  assert (short.data.rho, short.data.eta) == (0.9, 0.3)
  # The main job (issue #19): shortcut world, 3 families x 3 regularisers x 2 seeds; the
  # CER cells carry the swap hinge, the baselines nothing; the plain world keeps β = 0.
  main = sweep.expand(smoke.get_config())
  assert len(main) == 18
  assert {(c.config.data.rho, c.config.data.eta) for c in main} == {(0.9, 0.3)}
  assert {c.config.seed for c in main} == {0, 1}
  assert {(c.config.cer.regularizer, c.config.cer.lambda_ev, c.config.cer.beta_swap)
          for c in main} == {("none", 0.0, 0.0), ("evidence", 1.0, 1.0),
                             ("evidence_distractor", 1.0, 1.0)}
  plain = sweep.expand(smoke.get_config("full,world=plain,seeds=1"))
  assert {c.config.cer.beta_swap for c in plain} == {0.0} and len(plain) == 6
  assert {c.config.cer.beta_swap for c in sweep.expand(smoke.get_config("full,swap=0.5"))
          } == {0.0, 0.5}
  with pytest.raises(ValueError, match="world"):
    smoke.get_config("full,world=mars")


def test_every_paper_variant_expands_into_valid_cells():
  """configs/paper.py: each variant's cells pass the grid's validation (k = 1 only with
  the evidence term; the probe site f and H1's shortcut channels are swept)."""
  from configs import paper  # pylint: disable=g-import-not-at-top
  from ceu_jax.grid import sweep, validate  # pylint: disable=g-import-not-at-top
  counts = {v: sweep.expand(paper.get_config(v), validate=validate.validate_cell)
            for v in paper.VARIANTS}
  assert {v: len(c) for v, c in counts.items()} == dict(main=972, k_ablation=36, sites=36,
                                                        h1=54)
  ks = {(c.config.cer.regularizer, c.config.cer.k) for c in counts["k_ablation"]}
  assert ks == {("none", 1), ("evidence", 1), ("evidence_distractor", 2),
                ("evidence_distractor", 3)}
  assert {c.config.model.read_port for c in counts["sites"]} == {0, -1}
  assert {(c.config.data.rho, c.config.model.bypass) for c in counts["h1"]} == {
      (r, b) for r in (0.0, 0.5, 0.9) for b in (False, True)}
  with pytest.raises(ValueError, match="variant must be one of"):
    paper.get_config("granularity")


def test_third_party_info_is_filtered_ours_and_warnings_kept():
  f = cli._ThirdPartyInfoFilter()  # pylint: disable=protected-access
  ours = os.path.join(ROOT, "ceu_jax", "train", "loop.py")
  orbax = "/venv/lib/python3.11/site-packages/orbax/checkpoint/checkpoint_manager.py"
  rec = lambda path, level: logging.LogRecord("absl", level, path, 1, "m", (), None)
  assert f.filter(rec(ours, logging.INFO))
  assert not f.filter(rec(orbax, logging.INFO))
  assert f.filter(rec(orbax, logging.WARNING))
  tfds = "/venv/lib/python3.11/site-packages/tensorflow_datasets/core/dataset_builder.py"
  benign = logging.LogRecord("absl", logging.WARNING, tfds, 1,
                             "Using custom data configuration: %s", ("x",), None)
  assert not f.filter(benign)


def test_a_third_party_threads_error_is_one_line_without_its_traceback():
  """Issue #34.3: Orbax logs one error with its traceback per background thread (a full
  disk); at verbosity 0 each is one line, the main thread's error names the cause."""
  f = cli._ThirdPartyInfoFilter()  # pylint: disable=protected-access
  orbax = "/venv/lib/python3.11/site-packages/orbax/checkpoint/async_checkpointer.py"
  try:
    raise OSError(28, "No space left on device")
  except OSError:
    exc = sys.exc_info()
  rec = logging.LogRecord("absl", logging.ERROR, orbax, 1, "save failed: %s\nTraceback (most "
                          "recent call last):\n  ...", ("step 40",), exc)
  assert f.filter(rec)
  assert rec.getMessage() == "save failed: step 40"
  assert rec.exc_info is None and rec.exc_text is None and rec.stack_info is None
  handler = logging.StreamHandler(io.StringIO())
  handler.handle(rec)
  assert handler.stream.getvalue() == "save failed: step 40\n"


def test_one_line_errors():
  assert cli.one_line(ValueError("cer.alpha must be in (0, 1],\n got 1.5")) == (
      "error: cer.alpha must be in (0, 1], got 1.5 (--verbosity=1 shows the traceback)")
  assert cli.one_line(FileNotFoundError("x")).startswith("error: FileNotFoundError: x")
  verbose = cli._verbose_argv  # pylint: disable=protected-access
  assert verbose(["--verbosity=1"]) and verbose(["-v", "2"])
  assert not verbose(["--verbosity=0", "--x=1"])


def _run(*args):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


def test_entry_point_errors_are_one_line_exit_1(tmp_path):
  w = str(tmp_path / "w")
  proc = _run("--config=configs/atr_insert.py:tiny,bypass=treu", f"--workdir={w}")
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: --config: config argument bypass="), \
      proc.stderr
  proc = _run("--config=configs/atr_insert.py:tiny", f"--workdir={w}", "--config.cer.alpha=1.5")
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      "error: cer.alpha must be in (0, 1], got 1.5 (--verbosity=1 shows the traceback)"]
  assert not os.path.exists(w)
  proc = _run("--config=configs/atr_insert.py:tiny", f"--workdir={w}", "--config.cer.alpha=1.5",
              "--verbosity=1")
  assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr


def test_audit_readers_keep_their_training_world_when_the_main_job_moves():
  """The answer-presence readers train in the plain smoke world (ρ 0.3, η 0, 1,000 steps:
  the README's tables); the trace / mediator readers replace the data section."""
  from configs import answer_presence  # pylint: disable=g-import-not-at-top
  ap = answer_presence._train_config(False, None)  # pylint: disable=protected-access
  assert (ap.data.rho, ap.data.eta, ap.train.num_steps) == (0.3, 0.0, 1000)
  assert "sweep" not in ap and "grid" not in ap
  data = ml_collections.ConfigDict(dict(task="atr_chain"))
  rc = smoke.audit_reader_config(data, "ssm", False, 4000)
  assert rc.data.to_dict() == {"task": "atr_chain"} and rc.train.num_steps == 4000
  assert (rc.train.batch_size, rc.train.learning_rate, rc.train.warmup_steps) == (32, 3e-3, 50)


def _entry_points_with_a_config() -> list[tuple[str, str]]:
  """(module, the config its docstring runs) for every experiments/*.py with --config."""
  out = []
  for name in sorted(os.listdir(os.path.join(ROOT, "experiments"))):
    with open(os.path.join(ROOT, "experiments", name)) as f:
      text = f.read()
    if re.search(r"DEFINE_config_file\(\s*[\"']config[\"']", text):
      spec = re.search(r"--config[ =](configs/\w+\.py(?::[\w,=.]+)?)", text)
      assert spec, f"experiments/{name}: its docstring shows no --config command"
      out.append((name[:-3], spec.group(1)))
  return out


def _a_nested_field(config, prefix: str = "") -> str | None:
  """The first leaf field inside a section (dotted), else None."""
  for k, v in config.items():
    if isinstance(v, ml_collections.ConfigDict):
      inner = _a_nested_field(v, f"{prefix}{k}.")
      if inner:
        return inner
    elif prefix:
      return prefix + k
  return None


@pytest.mark.parametrize("module,spec", _entry_points_with_a_config())
def test_a_field_typo_in_any_entry_points_config_is_one_line_naming_the_nearest(module, spec):
  """Issue #34.3: every entry point parses its flags with `cli.parse_flags` (`cli.run`,
  tests/test_layering.py); a typo of a config field, top-level or in a section, is named
  with the nearest known field."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, _, arg = spec.partition(":")
  mspec = importlib.util.spec_from_file_location(f"_typo_{module}", os.path.join(ROOT, path))
  mod = importlib.util.module_from_spec(mspec)
  mspec.loader.exec_module(mod)
  config = mod.get_config(arg) if arg else mod.get_config()
  top = max((k for k, v in config.items() if not isinstance(v, ml_collections.ConfigDict)),
            key=len, default=None)    # the longest top-level field, if any
  fields = [f for f in (top, _a_nested_field(config)) if f]
  assert fields, module
  for field in fields:
    typo = field[:-1]
    line = cli.unknown_field_line([f"--config={spec}", "--workdir=W", f"--config.{typo}=4"])
    assert line == (f"error: --config.{typo}: no such field in {spec}; the nearest known "
                    f"field is {field}"), (module, line)


def test_steps_below_the_default_warmup_scale_it():
  """Issue #34.3: `steps=N` as the config argument scales the warm-up (at most N // 10), so
  `:tiny,steps=40` validates; --config.train.num_steps=40 says how (docs/bad_input.md)."""
  from ceu_jax.train import config as train_config  # pylint: disable=g-import-not-at-top
  c = atr_insert.get_config("tiny,steps=40")
  assert (c.train.num_steps, c.train.warmup_steps) == (40, 4)
  train_config.validate(c)
  c.train.num_steps = 30
  c.train.warmup_steps = 200
  with pytest.raises(ValueError, match=r"warmup_steps \(200\) must be <= train.num_steps "
                                       r"\(30\): set --config.train.warmup_steps"):
    train_config.validate(c)
