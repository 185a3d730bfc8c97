"""benchmarks/accelerator_check.py: the paper-grid hours from step times (against a
hand count of configs/paper.py's cells), and the whole check in its tiny form on the
CPU (every section runs and prints its numbers)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import accelerator_check as ac
from tests.test_multiprocess_helpers import fast_compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = os.path.join(ROOT, "docs", "accelerator", "h100_2026-11-26")
H200 = os.path.join(ROOT, "docs", "accelerator", "h200_2026-11-30")
H200_WARM = os.path.join(ROOT, "docs", "accelerator", "h200_2026-11-30_warm")


def _log(family: str, n: int, plain: float, k1: float, k2: float) -> list[str]:
  return [f"device: gpu x1; model {family}/p400k bypass=False; batch 128; context {n}",
          "compiled plain in 1.0 s", "variant    ms/step  ratio  (median of 3 rounds x 20 steps)",
          f"plain {plain:10.2f}   1.00", f"cer_k1 {k1:10.2f}   3.00  (SPEC ~3 forwards vs 1)",
          f"cer_k2 {k2:10.2f}   4.00  (SPEC ~4 forwards vs 1)"]


def test_grid_hours_equal_a_hand_count_of_the_paper_cells():
  # configs/paper.py main: per family 3 η x 3 δ x 2 n x 3 seeds = 54 cells of each of the
  # 6 regulariser settings: 1 plain, 3 evidence (k = 1), 2 evidence + distractor (k = 2).
  times = {"attention": (1.0, 3.0, 5.0), "ssm": (2.0, 7.0, 11.0), "memory_port": (4.0, 6.0, 8.0)}
  lines = [l for f, t in times.items() for l in _log(f, 512, *t)]
  lines += _log("ssm", 256, 100.0, 100.0, 100.0)        # a shorter context: not used
  out = ac.grid_hours(lines)
  expect = {f: 20000 * 54 * (p + 3 * e + 2 * d) / 3.6e6 for f, (p, e, d) in times.items()}
  for family, hours in expect.items():
    line = next(l for l in out if l.strip().startswith(family))
    assert f"{hours:8,.1f} h" in line
  assert f"{sum(expect.values()):,.0f} device-hours" in out[0]
  assert "972 cells x 20000 steps" in out[0]


def test_grid_hours_total_needs_every_family_and_step_kind():
  assert ac.grid_hours(_log("attention", 512, 1, 2, 3)[:4]) == []   # no family complete
  one = ac.grid_hours(_log("attention", 512, 1, 2, 3))
  assert "no total: ssm, memory_port not timed in every step kind" in one[0]
  assert "device-hours" not in one[0] and len(one) == 2
  assert f"{20000 * 54 * (1 + 3 * 2 + 2 * 3) / 3.6e6:8,.1f} h" in one[1]
  partial = _log("ssm", 512, 1, 2, 3)[:4] + _log("attention", 512, 1, 2, 3) + _log(
      "memory_port", 512, 1, 2, 3)
  out = ac.grid_hours(partial)
  assert "no total: ssm not timed" in out[0]
  assert [l.split()[0] for l in out[1:]] == ["attention", "memory_port"]


def test_the_readme_h100_hours_come_from_the_committed_logs(capsys):
  logs = ",".join(os.path.join(H100, f) for f in ("run1_train.log", "run2_train_mp.log"))
  ac.main(["--from_log", logs])
  out = capsys.readouterr().out
  assert "195 device-hours" in out
  assert "ssm             153.0 h" in out


def test_the_h200_ssm_hours_come_from_the_committed_logs(capsys):
  """docs/benchmarks.md's H200 row: the ssm's share of the paper grid from the
  committed train log (the attention / memory_port train steps ran out of time)."""
  ac.main(["--from_log", os.path.join(H200, "call1_train.log")])
  out = capsys.readouterr().out
  assert "no total: attention, memory_port not timed" in out
  assert "ssm              88.6 h  (ms/step plain 18.97, cer_k1 55.44, cer_k2 55.03)" in out
  with open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8") as f:
    doc = f.read()
  assert "18.97 / 55.44 / 55.03" in doc and "88.6 device-hours" in doc


@pytest.mark.parametrize("call, total, chunked, instead", [
    ("call1", 100, "ssm:chunked      44.4 h  (ms/step plain 12.87, cer_k1 27.32, cer_k2 26.52)",
     70),
    ("call2", 98, "ssm:chunked      42.9 h  (ms/step plain 12.17, cer_k1 26.07, cer_k2 26.28)",
     68)])
def test_the_h200_grid_hours_come_from_the_committed_logs(capsys, call, total, chunked,
                                                          instead):
  """docs/benchmarks.md's and the README's H200 grid hours (every family timed, the ssm
  with 'associative' — 'auto' then — and with 'chunked') from the committed logs."""
  ac.main(["--from_log", os.path.join(H200_WARM, f"{call}_train.log")])
  out = capsys.readouterr().out
  assert f"{total} device-hours" in out and chunked in out
  assert f"(total with it instead: {instead} device-hours)" in out
  docs = [os.path.join("docs", "benchmarks.md")] + (["README.md"] if call == "call2" else [])
  for doc in docs:      # the README quotes call 2 (3 x 20 steps)
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
      text = f.read()
    assert f"{total} device-hours" in text and f"{instead} device-hours" in text, doc


@pytest.mark.parametrize("flag", ["train=0", "trian=5", "train", "cell=x", "audit=-1"])
def test_bad_limits_are_refused_naming_the_item(capsys, flag):
  with pytest.raises(SystemExit):
    ac.main(["--limits", f"backend=30,{flag}"])
  err = capsys.readouterr().err
  assert f"--limits: '{flag}' must be <section>=<seconds > 0>" in err


def test_cache_dir_default_flag_and_user_env(monkeypatch, tmp_path):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  assert ac._cache_dir(None, tiny=True) == ""
  assert ac._cache_dir(None, tiny=False).endswith("ceu_jax_accelerator_check_cache")
  assert ac._cache_dir("none", tiny=False) == ""
  assert ac._cache_dir(str(tmp_path), tiny=True) == str(tmp_path)
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere")
  assert ac._cache_dir("none", tiny=False) == "/somewhere"


def test_unknown_section_is_refused_naming_the_choices(capsys):
  with pytest.raises(SystemExit):
    ac.main(["--sections", "backend,trian"])
  assert "unknown ['trian']" in capsys.readouterr().err


def test_tiny_check_runs_every_section_on_the_cpu(tmp_path):
  """The whole tiny check, through the warm-up: every command compiled side by side
  first, then the timed sections compile nothing new (every program they run was in
  the cache)."""
  env = fast_compile_env(dict(os.environ, JAX_PLATFORMS="cpu"))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  out_dir, cache = tmp_path / "out", tmp_path / "cache"
  p = subprocess.run([sys.executable, "-m", "benchmarks.accelerator_check", "--tiny",
                      "--out", str(out_dir), "--warm", "2", "--cache_dir", str(cache)],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                     check=False)
  out = p.stdout
  assert p.returncode == 0, out[-3000:] + p.stderr[-3000:]
  for name in ac.SECTIONS:
    assert f"SECTION {name} ok" in out, out[-3000:]
    assert (out_dir / f"{name}.log").exists()
    assert f"WARM {name}[" in out
  warm = [l for l in out.splitlines() if l.startswith("WARM ")]
  assert len(warm) == len(ac.SECTIONS) and all(l.split()[2] == "ok" for l in warm), warm
  assert "(0 new since the warm-up)" in out, out[-3000:]
  warm_log = (out_dir / "warm.log").read_text()
  assert "[train:1] $ " in warm_log and "--steps=1" in warm_log
  assert '"warm"' in (out_dir / "accelerator_check.json").read_text()
  assert "backend cpu" in out
  assert "TARGET cer_k3_step_ratio" in out and "TARGET decode_speedup" in out
  assert "cell wall" in out and "audit_bench: preset=p100k" in out
  assert "TARGET accelerator_check_sections_ok 5 >= 5 PASS" in out


def test_train_bench_target_line_per_family():
  """train_bench's TARGET line names the family and uses its goal (issue #37, item 3)."""
  from benchmarks import train_bench  # pylint: disable=g-import-not-at-top
  assert train_bench.target_line("attention", 2.49) == (
      "TARGET cer_k3_step_ratio_attention 2.49 <= 2.5 PASS")
  assert train_bench.target_line("memory_port", 2.61).endswith("<= 2.5 MISS")
  assert train_bench.target_line("ssm", 2.9) == "TARGET cer_k3_step_ratio_ssm 2.90 <= 3.0 PASS"
  assert train_bench.target_line("ssm", 2.9, target=2.0).endswith("<= 2.0 MISS")


def test_another_ssm_scan_is_timed_apart_and_not_in_the_total():
  """`--ssm_scan_impls=chunked`: one more ssm train_bench run with `--scan_impl=chunked`;
  its step times are keyed 'ssm:chunked' and priced as the ssm's cells, beside the
  total (which uses the model's own scan), never in it."""
  cmds = ac._commands(False, "/w", 20, 3, ("chunked",))["train"]
  assert len(cmds) == len(ac.FAMILIES) + 1
  assert cmds[-1][-1] == "--scan_impl=chunked" and "family=ssm" in " ".join(cmds[-1])
  tiny = ac._commands(True, "/w", ssm_scans=("chunked",))["train"]
  assert len(tiny) == 2 and tiny[-1][-1] == "--scan_impl=chunked"
  times = {"attention": (1.0, 3.0, 5.0), "ssm": (2.0, 7.0, 11.0), "memory_port": (4.0, 6.0, 8.0)}
  lines = [l for f, t in times.items() for l in _log(f, 512, *t)]
  scan = _log("ssm", 512, 1.0, 2.0, 3.0)
  scan[0] = scan[0].replace("bypass=False;", "bypass=False; scan chunked;")
  assert ac.step_times(scan) == {("ssm:chunked", 512): {"plain": 1.0, "cer_k1": 2.0,
                                                        "cer_k2": 3.0}}
  out = ac.grid_hours(lines + scan)
  total = sum(20000 * 54 * (p + 3 * e + 2 * d) / 3.6e6 for p, e, d in times.values())
  assert f"{total:,.0f} device-hours" in out[0]
  alt = next(l for l in out if l.strip().startswith("ssm:chunked"))
  assert f"{20000 * 54 * (1 + 3 * 2 + 2 * 3) / 3.6e6:8,.1f} h" in alt
  assert "instead of ssm's, not in the total" in alt
  swapped = total - 20000 * 54 * (2 + 3 * 7 + 2 * 11) / 3.6e6 + 20000 * 54 * 13 / 3.6e6
  assert f"(total with it instead: {swapped:,.0f} device-hours)" in alt
  assert "total with it instead" not in "".join(ac.grid_hours(lines[6:] + scan))  # no total


def test_unknown_ssm_scan_is_refused_naming_the_choices(capsys):
  with pytest.raises(SystemExit):
    ac.main(["--sections", "train", "--ssm_scan_impls", "chunked,quick"])
  err = capsys.readouterr().err
  assert "--ssm_scan_impls: unknown ['quick']" in err and "associative" in err


def test_train_bench_scan_impl_refused_before_compiling():
  from absl import app as absl_app  # pylint: disable=g-import-not-at-top
  from benchmarks import train_bench  # pylint: disable=g-import-not-at-top
  from configs import atr_insert  # pylint: disable=g-import-not-at-top
  with pytest.raises(absl_app.UsageError, match="the ssm family's option"):
    train_bench.with_scan_impl(atr_insert.get_config("tiny,family=attention"), "chunked")
  with pytest.raises(absl_app.UsageError, match="must be one of"):
    train_bench.with_scan_impl(atr_insert.get_config("tiny,family=ssm"), "quick")
  c = atr_insert.get_config("tiny,family=ssm")
  assert train_bench.with_scan_impl(c, "") is c
  assert dict(train_bench.with_scan_impl(c, "chunked").model.overrides) == {"scan_impl": "chunked"}
  assert "overrides" not in c.model        # the caller's config is left alone


def test_warm_up_runs_every_timed_program_once_with_one_step():
  """--warm's commands: the timed sections' own, train_bench with one step and round
  (its programs do not depend on them), the full audit split per family."""
  pairs = ac._warm_commands(False, "/w", list(ac.SECTIONS), ("chunked",))
  names = [name for name, _ in pairs]
  assert names == ["backend"] + ["train"] * 4 + ["cell", "decode"] + ["audit"] * 3
  timed = ac._commands(False, "/w", 20, 3, ("chunked",))["train"]
  for (_, cmd), t in zip(pairs[1:5], timed):
    assert [a for a in cmd if not a.startswith(("--steps", "--rounds"))] == [
        a for a in t if not a.startswith(("--steps", "--rounds"))]
    assert "--steps=1" in cmd and "--rounds=1" in cmd
  assert [cmd[-1] for _, cmd in pairs[-3:]] == [f"--families={f}" for f in ac.FAMILIES]
  assert ac._warm_commands(True, "/w", ["audit"], ())[0][1][-1] == "--preset=p100k"


@pytest.mark.parametrize("flags, message", [
    (["--warm", "-1"], "--warm '-1' must be 'auto' or a count >= 0"),
    (["--warm", "2", "--warm_limit", "0"], "--warm_limit 0.0 must be > 0"),
    (["--warm", "2", "--cache_dir", "none"], "it needs one"),
])
def test_bad_warm_flags_are_refused(capsys, monkeypatch, flags, message):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  with pytest.raises(SystemExit):
    ac.main(["--sections", "train", *flags])
  assert message in capsys.readouterr().err


def test_warm_auto_is_half_the_cores_for_the_full_check_only(monkeypatch):
  monkeypatch.setattr(os, "cpu_count", lambda: 16)
  assert ac.warm_count("auto", False, "/cache") == 8
  assert ac.warm_count("auto", True, "/cache") == 0 and ac.warm_count("auto", False, "") == 0
  assert ac.warm_count("3", True, "/cache") == 3
  monkeypatch.setattr(os, "cpu_count", lambda: 1)
  assert ac.warm_count("auto", False, "/cache") == 1
