"""Issue #20.3: audits on a device mesh (8 fake CPU devices in a subprocess).

`experiments.audit` (`ceu_jax.audit_job.run_audit`) audits on the mesh of the
workdir's `config.sharding`: each eval batch split over the data axis. The same
checkpoint is audited
  - on one device (this test process),
  - on 8 devices, pure data parallelism (batch split 8 ways),
  - on a 2 x 4 data x model mesh (batch split 2 ways, kv/mlp features 4 ways),
and the per-example rows are compared: L+, L−, L_int of every probe at 1e-5,
the flags (correct, has_evidence, dis_found, degenerate) exactly. The CEU ratios
(L_int − L−) / (L+ − L−) amplify a float error δ of the log-likelihoods by about
(|L+| + |L−| + |L_int|) / gap: they are compared with that propagated bound,
1e-5 · (|L+| + |L−| + |L_int|) / gap + 1e-6, i.e. through their ingredients.

Memory per device (compiled `engine.audit_lowered(...).memory_analysis()` of the
engine on the real tiny model, batch 64): splitting the batch 8 ways divides
each device's temporaries; at a fixed probe chunk C the temporaries do not grow
with the number of probes K, where evaluating all K probes in one vmap does.
Numbers are printed (-s).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.test_multiprocess_helpers import REPO, env_for
from tests.test_train_helpers import describe

MODEL_RULES = (("batch", "data"), ("kv", "model"), ("mlp", "model"), ("length", None),
               ("ctx", None), ("embed", None), ("heads", None), ("vocab", None),
               ("ports", None), ("state", None))
LOGLIKS = ("L_plus", "L_minus", "L_int_ev", "L_int_dis", "L_int_control", "delta_L",
           "delta_ev", "delta_dis", "delta_control")
FLAGS = ("example_id", "correct", "has_evidence", "dis_found", "degenerate")
PROBES = ("ev", "dis", "control")


def micro_config():
  from configs import atr_insert  # pylint: disable=g-import-not-at-top
  c = atr_insert.get_config("tiny,context_len=64,steps=4")
  c.data.num_passages = 4
  c.data.n_ids = c.data.n_keys = c.data.n_values = 8
  c.train.batch_size = 16
  c.train.warmup_steps = 1
  c.train.learning_rate = 1e-2
  c.train.eval_every = 0
  c.train.checkpoint_every = 4
  c.eval.num_examples = 32
  c.eval.batch_size = 16
  c.eval.corruptions = ("value_swap", "removal")
  return c


def mesh_config(kind: str):
  c = micro_config()
  if kind == "data_model":
    c.sharding.mesh_shape = (2, 4)
    c.sharding.mesh_axes = ("data", "model")
    c.sharding.logical_axis_rules = MODEL_RULES
  return c


SCRIPT = textwrap.dedent('''
    import json, sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import architectures
    from ceu_jax import audit_job, engine
    from ceu_jax import auditor as auditor_lib
    from ceu_jax import retrieval_adapter as adapter
    from ceu_jax.train import task as task_lib
    from tests.test_sharded_audit import mesh_config

    assert jax.device_count() == 8
    root = sys.argv[1]
    logs = {}
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound, as in the test
    for kind in ("data", "data_model"):
      lines = []
      audit_job.run_audit(mesh_config(kind), f"{root}/{kind}", data_dir=f"{root}/evalsets",
                          log=lines.append)
      logs[kind] = lines
    jax.config.update("jax_disable_most_optimizations", False)

    # Memory per device of the engine's compiled audit (temporaries), batch 64: XLA's
    # optimised programs, as a user compiles them.
    config = mesh_config("data")
    task = task_lib.build_task(config)
    b = task.audited
    plus = task.data.generate_batch(task.data_cfg, 0, 0, 64, "train")
    minus = task.data.corrupt(task.data_cfg, plus, "value_swap", jax.random.PRNGKey(1))
    clean, corrupt = adapter.ModelInputs.of(plus), adapter.ModelInputs.of(minus)
    variables = architectures.init_params(b.model, jax.random.PRNGKey(0))
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    split = NamedSharding(mesh, P("data"))

    def probes(k):
      span = jax.random.bernoulli(jax.random.PRNGKey(k), 0.1,
                                  (k,) + plus.context.shape)
      return engine.span_probes(span, names=tuple(f"p{i}" for i in range(k)))

    def temp(k, chunk, sharding):
      low = engine.audit_lowered(b.loglik_fn, variables, clean=clean, corrupt=corrupt,
                                 site=b.site, probes=probes(k), chunk_size=chunk,
                                 allow_approximate=b.approximate, batch_sharding=sharding)
      return int(low.compile().memory_analysis().temp_size_in_bytes)

    mem = {"one_device_K32_C4": temp(32, 4, None), "split8_K32_C4": temp(32, 4, split),
           "split8_K8_C4": temp(8, 4, split), "split8_K128_C4": temp(128, 4, split),
           "split8_K128_unchunked": temp(128, 128, split)}
    print("RESULT " + json.dumps({"logs": logs, "memory": mem}))
''')


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
  """One checkpoint (4 training steps), audited on 1 device here and on 8 in a
  subprocess (two meshes), each in its own copy of the workdir. Training and audits are
  compile-bound: compiled with most XLA optimisations off, here and there alike."""
  from ceu_jax import audit_job  # pylint: disable=g-import-not-at-top
  from ceu_jax.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  from tests.conftest import fast_compile  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("sharded_audit")
  trained = str(root / "trained")
  with fast_compile():
    train_and_evaluate(micro_config(), trained)
  for kind in ("one", "data", "data_model"):
    shutil.copytree(trained, root / kind)
  with fast_compile():
    audit_job.run_audit(micro_config(), str(root / "one"), data_dir=str(root / "evalsets"),
                        log=lambda s: None)
  script = root / "audit8.py"
  script.write_text(SCRIPT)
  proc = subprocess.run([sys.executable, str(script), str(root)], cwd=REPO,
                        env=env_for(8, fast_compile=True), capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, describe(proc)
  result = json.loads(proc.stdout.split("RESULT ", 1)[1])
  return root, result


def _rows(workdir, corruption: str) -> dict:
  d = os.path.join(workdir, "audit", "units")
  parts = [np.load(os.path.join(d, f)) for f in sorted(os.listdir(d))
           if f.startswith(corruption + "_")]
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0].files}


@pytest.mark.parametrize("kind", ["data", "data_model"])
def test_mesh_audit_rows_equal_one_device(audited, kind):
  root, result = audited
  shards = {"data": 8, "data_model": 2}[kind]
  assert any(f"split {shards} ways" in line for line in result["logs"][kind])
  for corruption in ("value_swap", "removal"):
    one, many = _rows(root / "one", corruption), _rows(root / kind, corruption)
    assert set(one) == set(many) and len(one["L_plus"]) == 32
    for k in FLAGS:
      np.testing.assert_array_equal(many[k], one[k], err_msg=k)
    for k in LOGLIKS:
      np.testing.assert_allclose(many[k], one[k], rtol=1e-5, atol=1e-5, err_msg=k)
    gap = one["L_plus"] - one["L_minus"]
    ok = ~one["degenerate"]
    assert ok.sum() >= 8, "too few non-degenerate rows to compare CEU"
    for p in PROBES:
      scale = np.abs(one["L_plus"]) + np.abs(one["L_minus"]) + np.abs(one[f"L_int_{p}"])
      bound = 1e-5 * scale / np.maximum(np.abs(gap), 1e-12) + 1e-6
      diff = np.abs(many[f"ceu_{p}"] - one[f"ceu_{p}"])
      assert np.all(diff[ok] <= bound[ok]), (p, diff[ok].max(), bound[ok].min())
      assert np.array_equal(np.isnan(many[f"ceu_{p}"]), np.isnan(one[f"ceu_{p}"]))


def test_probe_chunks_bound_memory_per_device(audited):
  _, result = audited
  mem = result["memory"]
  print("temporaries per device (bytes):", mem)
  # the batch split 8 ways: each device holds 1/8 of the examples
  assert mem["split8_K32_C4"] <= mem["one_device_K32_C4"] / 4
  # at a fixed chunk, more probes do not cost more memory per device
  assert mem["split8_K128_C4"] <= 1.1 * mem["split8_K8_C4"] + 64 * 1024
  # ... which is the chunking's doing: all 128 probes at once cost more
  assert mem["split8_K128_unchunked"] >= 2 * mem["split8_K128_C4"]


def test_chunk_rule_budgets_per_device(monkeypatch):
  """The 'auto' chunk rule counts the working set each device holds: traced shapes
  are global, a device holds 1 / batch_shards of the batch."""
  import types  # pylint: disable=g-import-not-at-top
  from ceu_jax.engine import chunking  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(chunking, "per_probe_bytes", lambda fn, c, p: 40 * chunking.MiB)
  probes = types.SimpleNamespace(num=64)
  assert chunking.choose(None, None, probes) == 2                    # 128 MiB CPU budget
  assert chunking.choose(None, None, probes, batch_shards=8) == 16   # 5 MiB per device
