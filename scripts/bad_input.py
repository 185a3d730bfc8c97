"""Bad input as a new user types it, and the one line each entry point prints (issue #34).

  python scripts/bad_input.py            # runs every case, writes docs/bad_input.md

Each case runs an entry point in a subprocess in a fresh temporary folder and
records its exit code, its stderr without absl's log lines, and whether it left
the workdir behind. tests/test_bad_input.py runs the same cases and asserts one
line, exit code 1 and no workdir debris.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG_LINE = re.compile(r"^[IWEF]\d{4} \d")    # absl log lines (warnings, not the error)


@dataclasses.dataclass(frozen=True)
class Case:
  what: str                  # what the user did
  module: str                # experiments.<module>
  args: tuple[str, ...]      # '{W}' is the workdir, '{T}' the temporary folder
  expect: str                # a substring of the one line
  setup: tuple[str, ...] = ()   # an earlier command (same placeholders), run first
  workdir_left: bool = False    # the case's workdir existed before (setup) or must


CASES = (
    Case("a typo in a training field", "train",
         ("--config=configs/atr_insert.py:tiny", "--workdir={W}",
          "--config.train.learning_rat=0.01"),
         "no such field in configs/atr_insert.py:tiny; the nearest known field is "
         "train.learning_rate"),
    Case("a field in a section the config does not have", "train",
         ("--config=configs/atr_insert.py:tiny", "--workdir={W}", "--config.atr.batch_sise=4"),
         "the nearest known field is train.batch_size"),
    Case("a section that does not exist (reader evaluation)", "reader_eval",
         ("--config=configs/reader_eval.py:tiny", "--workdir={W}",
          "--config.reader.batch_sise=4"),
         "the nearest known field is batch_size"),
    Case("a value of the wrong type", "train",
         ("--config=configs/atr_insert.py:tiny", "--workdir={W}",
          "--config.train.learning_rate=fast"),
         "could not convert string to float: 'fast'"),
    Case("a negative count as a config argument", "reader_eval",
         ("--config=configs/reader_eval.py:tiny,n_per_source=-3", "--workdir={W}"),
         "n_per_source must be an integer >= 1"),
    Case("a negative count in a reader's training recipe", "mediator",
         ("--config=configs/mediator.py:tiny", "--workdir={W}",
          "--config.atr.train.train.num_steps=-1"),
         "atr.train.train.num_steps must be an integer >= 1, got -1"),
    Case("fewer steps than the warm-up", "train",
         ("--config=configs/atr_insert.py:tiny", "--workdir={W}",
          "--config.train.num_steps=40"),
         "train.warmup_steps (200) must be <= train.num_steps (40): set "
         "--config.train.warmup_steps (e.g. 4), or give the steps as the config argument "
         "steps=N"),
    Case("an audit of a workdir that does not exist", "audit",
         ("--config=configs/atr_insert.py:tiny", "--workdir={W}"),
         "does not exist: give the workdir of a training run"),
    Case("a workdir below a file (an OSError)", "mediator",
         ("--config=configs/mediator.py:tiny,world=oracle", "--workdir={T}/file/w"),
         "NotADirectoryError: [Errno 20] Not a directory", setup=("touch", "{T}/file")),
    Case("another job's workdir", "answer_presence",
         ("--config=configs/answer_presence.py:tiny,world=generated", "--workdir={W}"),
         "holds a mediator run ({W}/job.json); this is an answer_presence job",
         setup=("experiments.mediator", "--config=configs/mediator.py:tiny,world=oracle",
                "--workdir={W}"), workdir_left=True),
    Case("the same job with another config", "mediator",
         ("--config=configs/mediator.py:tiny,world=oracle,n_items=32", "--workdir={W}"),
         "holds a mediator run of another config: n_items 64 -> 32",
         setup=("experiments.mediator", "--config=configs/mediator.py:tiny,world=oracle",
                "--workdir={W}"), workdir_left=True),
)


def _fill(args, w: str, t: str) -> list[str]:
  return [a.replace("{W}", w).replace("{T}", t) for a in args]


def start(case: Case, tmp: str) -> subprocess.Popen:
  """Run the case's setup (if any), then start the case; returns the process."""
  w = os.path.join(tmp, "w")
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  if case.setup:
    cmd = _fill(case.setup, w, tmp)
    cmd = [sys.executable, "-m"] + cmd if cmd[0].startswith("experiments.") else cmd
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
  return subprocess.Popen([sys.executable, "-m", f"experiments.{case.module}"]
                          + _fill(case.args, w, tmp), cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def result(case: Case, proc: subprocess.Popen, tmp: str) -> dict:
  """{returncode, lines (stderr without log lines), expected (with {W} filled), workdir}."""
  _, err = proc.communicate(timeout=600)
  w = os.path.join(tmp, "w")
  out = dict(returncode=proc.returncode,
             lines=[l for l in err.splitlines() if l.strip() and not LOG_LINE.match(l)],
             expected=case.expect.replace("{W}", w), workdir=os.path.exists(w), tmp=tmp)
  shutil.rmtree(tmp, ignore_errors=True)      # the case's folder: checked, then removed
  return out


def run_all(cases=CASES) -> list[dict]:
  """Every case, in parallel (each in its own temporary folder)."""
  tmps = [tempfile.mkdtemp(prefix="bad_input_") for _ in cases]
  procs = [start(c, t) for c, t in zip(cases, tmps)]
  return [result(c, p, t) for c, p, t in zip(cases, procs, tmps)]


def main() -> None:
  rows = ["# Bad input: what each entry point prints", "",
          "Generated by `python scripts/bad_input.py` (tests/test_bad_input.py runs the same "
          "cases). Every case exits with code 1, prints one line on stderr (absl's log lines "
          "aside) and, unless the workdir held an earlier run, leaves no workdir behind. "
          "`--verbosity=1` shows the traceback instead. Temporary paths are shown as `W`.", "",
          "| what the user did | command | the one line printed | workdir left |",
          "|---|---|---|---|"]
  for case, r in zip(CASES, run_all()):
    w = os.path.join(r["tmp"], "w")
    show = lambda s: s.replace(w, "W").replace(r["tmp"], "T").replace("|", "\\|")  # noqa: E731
    cmd = f"`python -m experiments.{case.module} {' '.join(_fill(case.args, 'W', 'T'))}`"
    line = " / ".join(show(l) for l in r["lines"])
    rows.append(f"| {case.what} | {show(cmd)} | `{line}` (exit {r['returncode']}) | "
                f"{'yes (earlier run)' if r['workdir'] else 'no'} |")
  rows += ["", "Checked by hand (they need a training run or a full disk; see issue #34's "
           "closing note), their parts tested where a test can reach them: deleting the "
           "checkpoints of a completed run and training again prints one line (`error: W "
           "has no checkpoint to resume from, but it shows an earlier run (...). Refusing "
           "to retrain from step 0 silently: rerun with --fresh ...`) with no Orbax "
           "traceback after it (the refusal comes before Orbax starts its threads; "
           "tests/test_train_provenance.py refuses it); a run whose disk fills during an "
           "asynchronous checkpoint ends with one `error: RESOURCE_EXHAUSTED: ... No space "
           "left on device` line and status.json names the last committed checkpoint "
           "(`checkpoint_step`; tests/test_train_resume.py checks it after a kill inside a "
           "save) (Orbax's thread errors are one line each without their traceback: "
           "tests/test_cli_configs.py; tensorstore's C++ write callbacks still print "
           "'Event loop is closed' tracebacks, which this project cannot intercept). A "
           "read-only workdir is an OSError naming the path, one line like the table's "
           "'workdir below a file' (tests/test_jobs.py; skipped as root, whom chmod does "
           "not stop). A typo of a config field is named with the nearest known field in "
           "every entry point's config (tests/test_cli_configs.py)."]
  path = os.path.join(ROOT, "docs", "bad_input.md")
  with open(path, "w") as f:
    f.write("\n".join(rows) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
