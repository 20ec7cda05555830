"""What a run derives from its spec before its data (train/run_setup.py): derived once, then
read by the rest of the setup instead of asked again."""

from train_fixtures import tiny_config

from realformer_jax.train import build, memory, pretraining, run_setup


def test_the_mesh_and_the_memory_budget_are_derived_once(tmp_path, monkeypatch):
  spec = pretraining.validate_config(tiny_config())
  asked = []
  real_budget, real_mesh = memory.memory_budget, build.make_mesh
  monkeypatch.setattr(
    memory, 'memory_budget', lambda train: asked.append('budget') or real_budget(train)
  )
  monkeypatch.setattr(
    build, 'make_mesh', lambda *a, **k: asked.append('mesh') or real_mesh(*a, **k)
  )
  derived = run_setup.derive(spec, str(tmp_path / 'workdir'))
  # The setup the loop compiles is built on what was derived, asking for neither again.
  setup = build.make_setup(spec, memory_bytes=derived.budget[0], mesh=derived.mesh)
  assert asked == ['budget', 'mesh']
  assert setup.mesh is derived.mesh
  assert derived.data_shard == (0, 1)  # one process: it reads every row
  assert derived.config_json == spec.to_dict()
  assert not (tmp_path / 'workdir').exists()  # checked, not touched: the lock comes later
