"""The main job's grid end to end on real cells (CI size): `configs/smoke.py:tiny`
shrunk to micro models and 2 steps, through `ceu_jax.grid.main.run` — what
`experiments.grid` calls — with its report, strata table and plots."""
import os

import pytest

from ceu_jax.grid import aggregate, main as grid_main, sweep


def micro_smoke(steps: int = 2):
  from configs import smoke  # pylint: disable=g-import-not-at-top
  c = smoke.get_config(f"tiny,steps={steps}")
  c.train.batch_size, c.train.warmup_steps, c.train.checkpoint_every = 8, 1, steps
  c.eval.num_examples, c.eval.batch_size = 32, 32
  c.grid.delta_test, c.grid.n_test, c.grid.eta_test = (0.3, 0.9), (64,), (0.3,)
  c.model.overrides = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32, read_heads=2,
                           read_head_dim=8, reader_heads=2, reader_layers=1, mem_dim=16)
  family, regs = c.sweep                  # one family (CI time): baseline vs CER
  c.sweep = (((family[0][0], ("attention",)),), regs)
  return c


pytestmark = pytest.mark.usefixtures("fast_compiled")  # compile-bound: most XLA optimisations off


def test_tiny_smoke_grid_runs_and_reports_strata(tmp_path):
  """... and its audits trace the engine's program once: the cells' training-time
  evaluations and every condition of the same shapes share it (run_cell audits on the
  training run's mesh, as the evaluation does)."""
  import jax  # pylint: disable=g-import-not-at-top
  config = micro_smoke()
  workdir = str(tmp_path / "grid")
  traced = []
  def listen(event, duration, **kwargs):
    del duration
    if event == "/jax/core/compile/jaxpr_trace_duration":
      traced.append(kwargs.get("fun_name"))
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    out = grid_main.run(config, workdir, log=lambda s: None)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert traced.count("_audit_jit") == 1, traced.count("_audit_jit")
  cells = sweep.expand(config)
  assert out["failures"] == 0 and out["counts"]["done"] == len(cells) == 2
  assert {c.config.cer.beta_swap for c in cells} == {0.0, 1.0}
  rows = aggregate.read_results_csv(os.path.join(workdir, "results.csv"))
  assert len(rows) == 2 * 2                          # clean + δ = 0.9 per cell
  for r in rows:                                     # the shortcut world's strata
    n_mem, n_ev = int(r["em_memorised_n"]), int(r["em_evidence_only_n"])
    n_none = int(r["em_no_evidence_n"] or 0)
    assert 0 < n_mem and n_mem + n_ev + n_none == 32
    assert 0.0 <= float(r["degenerate"]) <= 1.0
  # every shifted condition's per-item rows are kept, and H3 is paired over them: its
  # per-seed value is the grid rows' difference of EM drops
  for c in cells:
    assert os.path.exists(aggregate.examples_path(
        os.path.join(workdir, "cells", c.cell_id), "delta=0.9"))
  from ceu_jax.grid import paired  # pylint: disable=g-import-not-at-top
  results = aggregate.select_results(workdir, config, log=lambda s: None)[0]
  [h3] = paired.h3_claims(rows, results, workdir, num_resamples=100)
  assert paired.H3_ITEMS in h3.numbers, h3.numbers
  [unpaired] = paired.h3_claims(rows, results)
  got = float(h3.numbers.split("seed (")[1].split(" ")[1])
  assert got == float(unpaired.numbers.split("seed (")[1].split(" ")[1]), (h3, unpaired)
  assert "n=64" in h3.numbers          # 32 clean + 32 shifted items
  text = open(out["report"]).read()
  assert "## Accurate, but is the evidence used?" in text
  assert "[memorised] = evidence present, answer memorisable" in text
  from ceu_jax import code_version  # pylint: disable=g-import-not-at-top
  assert f"CPU: {code_version.cpu_kind()} (every cell)." in text   # what computed the cells
  for stem in ("em_ceu_vs_delta", "pareto_em_supported"):
    assert os.path.getsize(os.path.join(workdir, "plots", f"{stem}.png")) > 1000
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):   # the grid's own cache, unless set
    assert os.listdir(os.path.join(workdir, grid_main.CACHE_DIR))
  # A rerun skips every finished cell.
  again = grid_main.run(config, workdir, log=lambda s: None)
  assert again["counts"]["skipped"] == 2 and again["counts"]["done"] == 0



def test_the_grid_keeps_its_programs_in_the_workdir_unless_a_cache_is_set(tmp_path):
  """`use_compilation_cache`: W/jax_cache when no cache directory is set (the test session
  sets one for every test, so the e2e run above uses that one), the user's when set."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  session = jax.config.jax_compilation_cache_dir
  min_s = jax.config.jax_persistent_cache_min_compile_time_secs
  try:
    jax.config.update("jax_compilation_cache_dir", None)
    path = grid_main.use_compilation_cache(str(tmp_path / "w"))
    assert path == os.path.join(str(tmp_path / "w"), grid_main.CACHE_DIR) and os.path.isdir(path)
    assert jax.config.jax_compilation_cache_dir == path
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    assert grid_main.use_compilation_cache(str(tmp_path / "w2")) == str(tmp_path / "mine")
    assert not os.path.exists(tmp_path / "w2" / grid_main.CACHE_DIR)
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_s)
    compilation_cache.set_cache_dir(session)
    compilation_cache.reset_cache()


if __name__ == "__main__":
  pytest.main([__file__, "-q"])
