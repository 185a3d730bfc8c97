"""Issue #20 item 2: activation sharding is live on a data x model mesh (2 x 4).

Runs in subprocesses with 8 fake CPU devices (XLA_FLAGS set before jax starts):
  1. the compiled program of every family lays out its read-port activation h_f
     [B, T, P, D] as the model's logical constraint says (batch over `data`, the
     feature axis `kv` over `model`), and the train step's program carries that
     annotation; without the mesh context (the earlier behaviour) it does not;
  2. training on the 2 x 4 mesh (activations and weights split over `model`)
     equals pure data parallelism (8 x 1) to 1e-5, evaluation included.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

from tests.test_multiprocess_helpers import fast_compile_env, subprocess_xla_flags
from tests.test_train_helpers import REPO, TINY_CONFIG, describe, metric_rows, run_train

# kv (per-head / slot features) and mlp split over `model`; everything else replicated.
MODEL_RULES = (("batch", "data"), ("kv", "model"), ("mlp", "model"), ("length", None),
               ("ctx", None), ("embed", None), ("heads", None), ("vocab", None),
               ("ports", None), ("state", None))

PROBE = textwrap.dedent('''
    import contextlib, json, sys
    import flax.linen as nn
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import architectures
    from ceu_jax import sharding as sharding_lib
    from ceu_jax.train import state as state_lib, task as task_lib
    sys.path.insert(0, sys.argv[1])
    import tiny_train_config

    assert jax.device_count() == 8
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound; layout unaffected
    out = {}
    for family in architectures.FAMILIES:
      config = tiny_train_config.get_config()
      config.model.family = family
      rules = sharding_lib.rules(config.sharding)
      mesh = sharding_lib.make_mesh(config.sharding)
      task = task_lib.build_task(config)
      path, method = task.site.path, task.site.method
      batch = task_lib.train_batch(task, 0, int(config.train.batch_size))
      x = batch.clean.model_inputs()
      params = architectures.init_params(task.model, jax.random.PRNGKey(0))
      bs = sharding_lib.batch_sharding(config.sharding, mesh)
      x = jax.device_put(x, bs)

      def apply(p, *x):
        got = {}
        def keep(next_fun, args, kwargs, context):
          y = next_fun(*args, **kwargs)
          if context.method_name == method and "/".join(context.module.path) == path:
            got["h"] = y
          return y
        with nn.intercept_methods(keep):
          logits = task.model.apply(p, *x)
        return logits, got["h"]

      want = NamedSharding(mesh, P("data", None, None, "model"))
      row = {}
      for live in (True, False):
        ctx = sharding_lib.mesh_context(mesh) if live else contextlib.nullcontext()
        with ctx, nn.logical_axis_rules(rules):
          compiled = jax.jit(apply).lower(params, *x).compile()
        h_sharding = compiled.output_shardings[1]
        row["live" if live else "off"] = dict(
            spec=str(getattr(h_sharding, "spec", h_sharding)),
            intended=bool(h_sharding.is_equivalent_to(want, 4)))
      h_shape = jax.eval_shape(apply, params, *x)[1].shape
      # The train step: its program constrains a tensor of h_f's shape as intended.
      tx = state_lib.make_optimizer(config.train)
      init_fn = state_lib.boxed_init_fn(task.model, tx, task.dummy_inputs)
      state, shardings = sharding_lib.state_layout(init_fn, jax.random.PRNGKey(0), mesh, rules)
      step = state_lib.make_train_step(task.model, tx, task.site, task.loss_cfg,
                                       state_shardings=shardings, batch_sharding=bs,
                                       axis_rules=rules, allow_approximate=task.approximate)
      tb = sharding_lib.shard_batch(batch, bs)
      # Shardy (jax's default partitioner) or GSPMD spelling of P('data', None, None, 'model').
      annotations = ('[{"data"}, {}, {}, {"model"}]', "devices=[2,1,1,4]<=[8]")
      tensor = "tensor<" + "x".join(map(str, h_shape)) + "xf32>"
      for live in (True, False):
        ctx = sharding_lib.mesh_context(mesh) if live else contextlib.nullcontext()
        with ctx, nn.logical_axis_rules(rules):
          text = step.lower(state, tb, jax.random.PRNGKey(1)).as_text()
        lines = [l for l in text.splitlines()
                 if ("sharding_constraint" in l or "@Sharding" in l) and tensor in l
                 and any(a in l for a in annotations)]
        row["step_live" if live else "step_off"] = len(lines)
      out[family] = row
    print("RESULT " + json.dumps(out))
''')


def _config_text(mesh_shape, mesh_axes, rules, family="attention", steps=8) -> str:
  return TINY_CONFIG + textwrap.dedent(f'''
    _base = get_config

    def get_config(arg=None):
      c = _base(arg)
      c.model.family = {family!r}
      c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = {steps}, {steps}, {steps}
      c.sharding.mesh_shape = {tuple(mesh_shape)!r}
      c.sharding.mesh_axes = {tuple(mesh_axes)!r}
      c.sharding.logical_axis_rules = {rules!r}
      return c
  ''')


def _env(devices: int) -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = subprocess_xla_flags(devices)   # inherited XLA_FLAGS + fake devices
  return fast_compile_env(env)                       # compile-bound; layouts unaffected


def test_read_port_activations_sharded_as_constrained(tmp_path):
  with open(tmp_path / "tiny_train_config.py", "w") as f:
    f.write(_config_text((2, 4), ("data", "model"), MODEL_RULES))
  script = tmp_path / "probe.py"
  script.write_text(PROBE)
  proc = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=REPO, env=_env(8),
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, describe(proc)
  import json  # pylint: disable=g-import-not-at-top
  result = json.loads(proc.stdout.split("RESULT ", 1)[1])
  assert set(result) == {"attention", "ssm", "memory_port"}
  for family, row in result.items():
    assert row["live"]["intended"], (family, row)            # P('data', None, None, 'model')
    assert not row["off"]["intended"], (family, row)         # inert without the mesh
    assert row["step_live"] >= 1, (family, row)              # in the train step's program
    assert row["step_off"] == 0, (family, row)


def _losses(workdir):
  rows = metric_rows(workdir, "train")
  return {k: np.array([r[k] for r in rows]) for k in ("loss", "task_nll", "cer_ev", "grad_norm")}


def test_model_parallel_training_equals_data_parallel(tmp_path):
  """memory_port (blocked encoder, kv/mlp split over `model`) on 2 x 4 vs 8 x 1."""
  runs = {"data": ((8,), ("data",), (("batch", "data"),)),
          "data_model": ((2, 4), ("data", "model"), MODEL_RULES)}
  out = {}
  for name, (shape, axes, rules) in runs.items():
    path = tmp_path / f"{name}.py"
    path.write_text(_config_text(shape, axes, rules, family="memory_port"))
    workdir = str(tmp_path / name)
    proc = run_train(str(path), workdir, devices=8, fast_compile=True)  # compile-bound
    assert proc.returncode == 0, describe(proc)
    out[name] = (_losses(workdir), metric_rows(workdir, "eval"))
  (dp, dp_eval), (mp, mp_eval) = out["data"], out["data_model"]
  assert len(dp["loss"]) == 8
  for key in dp:
    np.testing.assert_allclose(mp[key], dp[key], rtol=1e-5, atol=1e-5, err_msg=key)
  assert len(dp_eval) == len(mp_eval) == 1
  # Eval metrics that are sums/means of log-likelihoods agree to 1e-5. The CEU means
  # are ratios (L_int - L-)/(L+ - L-) with gaps down to eps = 1e-3, whose float32
  # error is amplified by |L|/gap (up to ~1e4 here): they are compared through their
  # ingredients (nll, em) and the per-step cer terms above, not as ratios.
  compared = [k for k, v in dp_eval[0].items()
              if isinstance(v, float) and not k.split("/")[-1].startswith("ceu_")]
  assert "nll" in compared and "em" in compared
  for key in compared:
    np.testing.assert_allclose(mp_eval[0][key], dp_eval[0][key], rtol=1e-5, atol=1e-5,
                               err_msg=key)
