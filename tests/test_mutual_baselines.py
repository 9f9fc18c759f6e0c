"""Table 1's baselines (mutual.baselines): MM-CBM, MM-ProtoSim, Feature Maps on cached features,
and their fit on the project's training loop (the numbers of the loop it replaced, resume,
divergence, no read-back per step)."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from mutual.baselines import bottleneck, cache, feature_maps, fitting, suite
from stori_jax.plumbing.errors import NonFiniteError, UserError
from stori_jax.trainloop import loop
from stori_jax.trainloop.checkpointer import NonFiniteWatch


def _toy(n_per_class=24, classes=3, grid=4, channels=8, seed=0):
  """Tokens [N, grid, grid, C]: class c lights channel c on a 2 x 2 block of patches at a
  class-specific place; the other patches are noise."""
  rng = np.random.default_rng(seed)
  labels = np.repeat(np.arange(classes), n_per_class).astype(np.int32)
  tokens = 0.1 * rng.normal(size=(len(labels), grid, grid, channels)).astype(np.float32)
  for i, c in enumerate(labels):
    tokens[i, c : c + 2, c : c + 2, c] += 3.0
  return cache.CachedFeatures(tokens, labels)


def _descriptors(d=6, e=5, seed=1):
  x = np.random.default_rng(seed).normal(size=(d, e)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


TRAIN = dict(epochs=40, batch_size=16, learning_rate=3e-2, final_learning_rate=3e-3, seed=0)


def _settings(**changes) -> fitting.FitSettings:
  """The toy fits' settings (TRAIN) with `changes`."""
  return fitting.FitSettings(**{**TRAIN, **changes})


@pytest.fixture(scope="module")
def trained():
  """Both bottlenecks trained once on the toy features: {attention: (model, result)}."""
  cached, desc = _toy(), _descriptors()
  return {
    a: bottleneck.train_bottleneck(cached, desc, 3, _settings(), attention=a, width=16)
    for a in ("softmax", "gumbel")
  }


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["softmax", "gumbel"])
def test_bottleneck_learns(trained, attention):
  cached, desc = _toy(), _descriptors()
  model, result = trained[attention]
  assert result.losses[-5:].mean() < 0.5 * result.losses[:5].mean()
  out = bottleneck.explain_bottleneck(model, result.params, cached.tokens, desc, cached.labels, 2)
  assert (out["logits"].argmax(1) == cached.labels).mean() > 0.9
  assert out["ids"].shape == (72, 2) and out["regions"].shape == (72, 2, 4, 4)


@pytest.mark.slow
def test_training_is_deterministic_given_the_seed(trained):
  """Same seed, same parameters (Gumbel noise included); another seed, others."""
  cached, desc = _toy(), _descriptors()
  runs = [
    bottleneck.train_bottleneck(
      cached, desc, 3, _settings(epochs=3, seed=s), attention="gumbel", width=16
    )[1]
    for s in (0, 0, 1)
  ]
  for a, b in zip(
    jax.tree_util.tree_leaves(runs[0].params), jax.tree_util.tree_leaves(runs[1].params)
  ):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(runs[0].losses, runs[1].losses)
  assert not np.allclose(
    runs[0].params["classifier"]["kernel"], runs[2].params["classifier"]["kernel"]
  )


def test_cbm_explanation_is_the_largest_contributions_to_the_explained_class(trained):
  cached = _toy()
  desc = _descriptors()
  model, result = trained["softmax"]
  tokens = cached.tokens[:5]
  predicted = np.array([0, 1, 2, 0, 1])
  out = bottleneck.explain_bottleneck(model, result.params, tokens, desc, predicted, 3, 0.5)
  # Jitted, as explain_bottleneck runs it (eagerly, a program per op).
  _, u, attention = jax.jit(model.apply)({"params": result.params}, cache.flat_tokens(tokens), desc)
  w = np.asarray(result.params["classifier"]["kernel"])  # [D, C]
  for i, p in enumerate(predicted):
    contribution = np.asarray(u[i]) * w[:, p]
    np.testing.assert_array_equal(out["ids"][i], np.argsort(-contribution)[:3])
    a = np.asarray(attention[i, out["ids"][i, 0]]).reshape(4, 4)
    lo, hi = a.min(), a.max()
    np.testing.assert_array_equal(out["regions"][i, 0], a >= lo + 0.5 * (hi - lo))
  assert out["valid"].all()  # softmax attention always has a maximum


def test_protosim_assigns_every_token_to_exactly_one_descriptor(trained):
  cached = _toy()
  desc = _descriptors()
  model, result = trained["gumbel"]
  _, _, attention = jax.jit(model.apply)(
    {"params": result.params}, cache.flat_tokens(cached.tokens), desc
  )
  np.testing.assert_allclose(np.asarray(attention).sum(axis=1), 1.0, atol=1e-6)
  assert set(np.unique(np.round(np.asarray(attention), 6))) <= {0.0, 1.0}
  out = bottleneck.explain_bottleneck(
    model, result.params, cached.tokens, desc, cached.labels, 6, 0.5
  )
  regions = out["regions"] & out["valid"][..., None, None]
  assert regions.sum(axis=1).max() <= 1  # hard assignment: the regions are disjoint
  # Descriptors with no token are never kept before those with tokens.
  nonempty = out["regions"].any(axis=(2, 3))
  np.testing.assert_array_equal(nonempty, out["valid"])
  assert all(np.all(np.diff(v.astype(int)) <= 0) for v in out["valid"])


@pytest.mark.slow
def test_gumbel_training_noise_is_used_and_seeded():
  model = bottleneck.MultimodalBottleneck(3, 8, "gumbel")
  tokens, desc = jnp.asarray(_toy().tokens[:4]).reshape(4, 16, 8), jnp.asarray(_descriptors())
  params = model.init({"params": jax.random.PRNGKey(0), "gumbel": jax.random.PRNGKey(1)}, tokens,
                      desc, train=True)["params"]  # fmt: skip

  def attention(key, noise=1.0):
    return model.apply({"params": params}, tokens, desc, train=True, noise_scale=noise,
                       rngs={"gumbel": key})[2]  # fmt: skip

  a, b = attention(jax.random.PRNGKey(2)), attention(jax.random.PRNGKey(3))
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(a, attention(jax.random.PRNGKey(2)))
  clean = model.apply({"params": params}, tokens, desc)[2]
  np.testing.assert_allclose(attention(jax.random.PRNGKey(2), 0.0), clean, atol=1e-6)


def test_feature_map_concepts_match_a_numpy_reference():
  rng = np.random.default_rng(3)
  tokens = rng.normal(size=(2, 5, 5, 12)).astype(np.float32)
  channels, regions, valid = feature_maps.feature_map_concepts(tokens, 3, 0.9, skip_object=True)
  for i in range(2):
    norms = np.sqrt((tokens[i] ** 2).sum(axis=(0, 1)))
    want = np.argsort(-norms)[1:4]  # the largest-norm channel (the object) skipped
    np.testing.assert_array_equal(channels[i], want)
    for j, c in enumerate(want):
      m = tokens[i, :, :, c]
      np.testing.assert_array_equal(regions[i, j], (m - m.min()) / (m.max() - m.min()) >= 0.9)
  assert valid.all()
  kept, _, _ = feature_maps.feature_map_concepts(tokens, 3, 0.9, skip_object=False)
  np.testing.assert_array_equal(kept[:, 1:], channels[:, :2])


def test_dropblock_drops_square_blocks_at_about_the_rate():
  # Jitted, as training runs it inside its step (eagerly, a program per op).
  dropblock = jax.jit(feature_maps.dropblock, static_argnums=(1, 2, 3))
  keep = np.asarray(dropblock(jax.random.PRNGKey(0), (400, 14, 14), 0.3, 3))
  assert set(np.unique(keep)) <= {0.0, 1.0}
  assert 0.55 < keep.mean() < 0.85
  # Every dropped patch lies in a fully dropped 3 x 3 block.
  for img in keep[:20]:
    for r, c in zip(*np.nonzero(img == 0)):
      assert any(
        (img[max(a, 0) : a + 3, max(b, 0) : b + 3] == 0).all() and a >= 0 and b >= 0
        and a + 3 <= 14 and b + 3 <= 14
        for a in range(r - 2, r + 1)
        for b in range(c - 2, c + 1)
      )  # fmt: skip
  np.testing.assert_array_equal(keep, dropblock(jax.random.PRNGKey(0), (400, 14, 14), 0.3, 3))
  everything = np.asarray(dropblock(jax.random.PRNGKey(0), (4, 3, 3), 1.0, 3))
  assert everything.sum(axis=(1, 2)).min() > 0  # never an empty image


@pytest.mark.slow
def test_labeler_names_a_region_by_its_class_descriptors():
  """Class c's descriptors are {2c, 2c + 1}: a region on class c's lit block gets one of them."""
  cached = _toy(n_per_class=32)
  targets = np.zeros((3, 6), np.float32)
  for c in range(3):
    targets[c, 2 * c : 2 * c + 2] = 1
  model, result = feature_maps.train_labeler(
    cached, targets, _settings(epochs=30), drop_rate=0.3, block_size=2
  )
  assert result.losses[-5:].mean() < result.losses[:5].mean()
  out = feature_maps.explain_feature_maps(model, result.params, cached.tokens, 2, 0.9, True)
  assert out["ids"].shape == (96, 2) and out["label_scores"].shape == (96, 2, 6)
  # The largest-norm channel is the class's lit channel; with skip_object=False its region is
  # the lit block, and its label one of the class's descriptors.
  own = feature_maps.explain_feature_maps(model, result.params, cached.tokens, 1, 0.9, False)
  assert (own["channels"][:, 0] == cached.labels).all()
  hit = targets[cached.labels, own["ids"][:, 0]]
  assert hit.mean() > 0.9


def test_descriptor_targets_and_fit_errors():
  t = cache.descriptor_targets(["a", "b"], {"a": ["x", "y"], "b": ["y", "zz"]}, ["x", "y", "z"])
  np.testing.assert_array_equal(t, [[1, 1, 0], [0, 1, 0]])
  with pytest.raises(ValueError, match="no training examples"):
    fitting.fit(lambda p, b, k, s: 0.0, {}, {"x": np.zeros((0, 2))}, fitting.FitSettings(1))


@pytest.mark.slow
def test_train_all_and_explain_on_toy_features():
  cached = _toy()
  desc = _descriptors()
  targets = np.eye(3, 6, dtype=np.float32)
  config = ml_collections.ConfigDict(
    dict(
      n_concepts=2,
      width=8,
      gumbel_temperature=1.0,
      region_threshold=0.5,
      feature_maps=dict(threshold=0.9, skip_object=True, drop_rate=0.3, block_size=2),
      train=dict(TRAIN, epochs=1),
    )
  )
  trained = suite.train_all(cached, desc, targets, config, progress=False)
  out = trained.explain(cached.tokens[:4], desc, np.zeros(4, int), config)
  assert set(out) == set(suite.NAMES)
  for e in out.values():
    assert e["ids"].shape == (4, 2) and e["regions"].shape == (4, 2, 4, 4)
  summary = trained.training_summary()
  assert all(s["steps"] == 72 // 16 for s in summary.values())


@pytest.mark.slow
def test_train_all_checkpoints_under_its_workdir_and_a_rerun_resumes(tmp_path, capfd):
  cached, desc, targets = _toy(), _descriptors(), np.eye(3, 6, dtype=np.float32)
  config = ml_collections.ConfigDict(
    dict(
      width=8,
      gumbel_temperature=1.0,
      feature_maps=dict(drop_rate=0.3, block_size=2),
      train=dict(TRAIN, epochs=1),
    )
  )
  first = suite.train_all(cached, desc, targets, config, progress=False, workdir=str(tmp_path))
  for name in suite.NAMES:  # the toy has no embeddings: no Standard nor LF-CBM
    assert sorted(os.listdir(tmp_path / suite.FOLDERS[name] / "checkpoints")) == ["3", "4"]
  capfd.readouterr()
  again = suite.train_all(cached, desc, targets, config, progress=False, workdir=str(tmp_path))
  assert capfd.readouterr().err.count("Resumed from step 4 of 4") == 3
  for a, b in zip(
    (first.cbm, first.protosim, first.labeler), (again.cbm, again.protosim, again.labeler)
  ):
    np.testing.assert_array_equal(a[1].losses, b[1].losses)
    for x, y in zip(jax.tree_util.tree_leaves(a[1].params), jax.tree_util.tree_leaves(b[1].params)):
      np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------------------------------------
# The fit on training.loop.


def _reference_fit(loss_fn, params, arrays, settings, **_):
  """The fit's loop before it ran on training.loop (issue 28), kept as the reference: Adam on a
  cosine decay, one numpy Generator's permutations, keys folded with the step, float(loss)
  read back every step."""
  epochs, batch_size, seed = settings.epochs, settings.batch_size, settings.seed
  learning_rate, final_learning_rate = settings.learning_rate, settings.final_learning_rate
  n = len(next(iter(arrays.values())))
  batch = min(int(batch_size), n)
  per_epoch = n // batch
  total = max(per_epoch * int(epochs), 1)
  schedule = optax.cosine_decay_schedule(
    learning_rate, decay_steps=total, alpha=final_learning_rate / learning_rate
  )
  optimizer = optax.adam(schedule)
  state = optimizer.init(params)

  @jax.jit
  def step(params, state, batch_arrays, key, progress):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch_arrays, key, progress)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  rng = np.random.default_rng(seed)
  base = jax.random.PRNGKey(seed)
  losses = []
  for _ in range(int(epochs)):
    perm = rng.permutation(n)
    for b in range(per_epoch):
      idx = perm[b * batch : (b + 1) * batch]
      chunk = {k: jnp.asarray(v[idx]) for k, v in arrays.items()}
      key = jax.random.fold_in(base, len(losses))
      params, state, loss = step(params, state, chunk, key, jnp.float32(len(losses) / total))
      losses.append(float(loss))
  return fitting.TrainResult(params, np.asarray(losses, np.float32), 0.0)


def _assert_same_params(a, b):
  leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("which", ["gumbel", "labeler"])
def test_fit_trains_to_the_numbers_of_the_loop_it_replaced(which, monkeypatch):
  """Same seed, same losses, parameters and accuracy, bit for bit: MM-ProtoSim (Gumbel keys and
  the noise's fade with progress) and the labeler (DropBlock keys)."""
  cached, desc = _toy(), _descriptors()
  targets = np.zeros((3, 6), np.float32)
  for c in range(3):
    targets[c, 2 * c : 2 * c + 2] = 1

  def train():
    if which == "gumbel":
      model, result = bottleneck.train_bottleneck(
        cached, desc, 3, _settings(epochs=10), attention="gumbel", width=16
      )
      out = bottleneck.explain_bottleneck(model, result.params, cached.tokens, desc, cached.labels)
      return result, (out["logits"].argmax(1) == cached.labels).mean()
    model, result = feature_maps.train_labeler(
      cached, targets, _settings(epochs=10), drop_rate=0.3, block_size=2
    )
    out = feature_maps.explain_feature_maps(model, result.params, cached.tokens, 1, 0.9, False)
    return result, targets[cached.labels, out["ids"][:, 0]].mean()

  new, new_accuracy = train()
  monkeypatch.setattr(fitting, "fit", _reference_fit)
  old, old_accuracy = train()
  assert len(new.losses) == 10 * (72 // 16)
  np.testing.assert_array_equal(new.losses, old.losses)
  _assert_same_params(new.params, old.params)
  assert new_accuracy == old_accuracy and new.losses[-5:].mean() < new.losses[:5].mean()


class Stopped(Exception):
  """The fit was stopped (a kill, Ctrl-C) while it gathered a batch."""


class StopsAfter:
  """An array whose batches can be gathered `calls` times, then stops the fit."""

  def __init__(self, array: np.ndarray, calls: int):
    self.array, self.calls = array, calls

  def __len__(self):
    return len(self.array)

  def __getitem__(self, index):
    if self.calls == 0:
      raise Stopped()
    self.calls -= 1
    return self.array[index]


def _softmax_regression(tokens):
  """A small fit that uses every input of the loss: params w [C, 3], the step's key (noise on
  the inputs) and progress (the noise fades)."""

  def loss_fn(params, batch, key, progress):
    x = batch["x"] + (1.0 - progress) * jax.random.normal(key, batch["x"].shape)
    logits = x @ params["w"].T + params["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  return loss_fn, {"w": jnp.zeros((3, tokens.shape[-1])), "b": jnp.zeros(3)}


def test_a_stopped_fit_resumes_to_the_parameters_of_an_uninterrupted_one(tmp_path, capfd):
  cached = _toy()
  x = cached.tokens.mean(axis=(1, 2))
  loss_fn, params = _softmax_regression(x)
  settings = fitting.FitSettings(5, 16, learning_rate=0.1, final_learning_rate=0.01, seed=3)
  common = dict(checkpoint_every=3)
  straight = fitting.fit(
    loss_fn,
    params,
    {"x": x, "labels": cached.labels},
    settings,
    workdir=str(tmp_path / "a"),
    **common,
  )
  assert len(straight.losses) == 20
  with pytest.raises(Stopped):  # stopped while the batch of step 11 (0-based) was gathered
    fitting.fit(
      loss_fn,
      params,
      {"x": StopsAfter(x, 11), "labels": cached.labels},
      settings,
      workdir=str(tmp_path / "b"),
      **common,
    )
  assert sorted(os.listdir(tmp_path / "b" / "checkpoints")) == ["6", "9"]
  capfd.readouterr()
  resumed = fitting.fit(
    loss_fn,
    params,
    {"x": x, "labels": cached.labels},
    settings,
    workdir=str(tmp_path / "b"),
    **common,
  )
  assert f"Resumed from step 9 of 20 in {tmp_path / 'b'}" in capfd.readouterr().err
  _assert_same_params(straight.params, resumed.params)
  np.testing.assert_array_equal(straight.losses, resumed.losses)  # the first 9 from the checkpoint


def test_a_diverged_fit_stops_with_the_nonfinite_paragraph(tmp_path):
  cached = _toy()
  x = cached.tokens.mean(axis=(1, 2))
  finite_loss, params = _softmax_regression(x)

  def loss_fn(params, batch, key, progress):  # NaN from half-way (step 11 of 20, 1-based) on
    return jnp.where(progress < 0.5, 1.0, jnp.nan) * finite_loss(params, batch, key, progress)

  with pytest.raises(NonFiniteError) as error:
    fitting.fit(
      loss_fn,
      params,
      {"x": x, "labels": cached.labels},
      fitting.FitSettings(epochs=5, batch_size=16, learning_rate=0.1, seed=0),
      desc="MM-CBM",
      workdir=str(tmp_path),
      checkpoint_every=4,
    )
  assert isinstance(error.value, UserError)
  message = str(error.value)
  assert message.startswith(
    "MM-CBM training stopped at step 11 of 20: the loss, the gradients and the weights became "
    "NaN or infinite. The likely cause is the learning rate (0.1, "
    "config.baselines.train.learning_rate"
  )
  assert f"the last good checkpoint (step 8) is kept in {tmp_path / 'checkpoints'}" in message
  assert "\n" not in message  # one paragraph
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["4", "8"]  # no step past the NaN


def test_a_fit_is_one_jitted_step_per_step_and_reads_nothing_back_until_the_end(monkeypatch):
  """No float(loss) per step: every read of a device array (jax's ArrayImpl._value) happens
  after the last step was dispatched, and the step is one compiled program called once a step."""
  cached = _toy()
  x = cached.tokens.mean(axis=(1, 2))
  loss_fn, params = _softmax_regression(x)
  dispatched, reads, programs = [], [], []
  array_type = type(jnp.zeros(()))
  value = array_type.__dict__["_value"]
  monkeypatch.setattr(
    array_type, "_value", property(lambda a: (reads.append(len(dispatched)), value.fget(a))[1])
  )
  real_loop = loop.train_loop

  def spied_loop(train_step, *args, **kwargs):
    def counted(state, batch):
      dispatched.append(1)
      return train_step(state, batch)

    state = real_loop(counted, *args, **kwargs)
    programs.append(train_step._cache_size())
    return state

  monkeypatch.setattr(loop, "train_loop", spied_loop)
  checks = []
  check = NonFiniteWatch.check
  monkeypatch.setattr(NonFiniteWatch, "check", lambda w, *a: (checks.append(1), check(w, *a))[1])
  result = fitting.fit(
    loss_fn, params, {"x": x, "labels": cached.labels}, fitting.FitSettings(5, batch_size=16)
  )
  assert len(dispatched) == 20 and programs == [1]
  assert reads and set(reads) == {20}, reads
  assert len(checks) <= 3  # the last step's log and checkpoint, and the loop's end
  assert np.isfinite(result.losses).all() and result.losses.shape == (20,)


def test_features_cached_on_disk_equal_the_cache_in_memory_and_train_alike(tmp_path, monkeypatch):
  """cache_features(directory=...): the patch features written as they come and read back
  memory-mapped (every ImageNet training image does not fit in memory), the same values and the
  same fit as the cache in memory."""
  toy = _toy()

  def encoded(bundle, images, kind="tokens", batch_size=64):
    del bundle, kind, batch_size
    rows = np.asarray(images)  # here the row indices of the toy features
    return toy.tokens[rows].mean(axis=(1, 2)), toy.tokens[rows]

  monkeypatch.setattr(cache, "encode_features", encoded)
  classes = [
    type("Class", (), dict(images=np.flatnonzero(toy.labels == c), label=c))() for c in range(3)
  ]
  memory = cache.cache_features(None, classes, dtype=np.float16, progress=False)
  disk = cache.cache_features(
    None, classes, dtype=np.float16, progress=False, directory=str(tmp_path / "features")
  )
  assert isinstance(disk.tokens, np.memmap) and not isinstance(memory.tokens, np.memmap)
  assert (tmp_path / "features/tokens.bin").stat().st_size == toy.tokens.size * 2
  for a, b in ((memory.tokens, disk.tokens), (memory.labels, disk.labels)):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(memory.embeddings, disk.embeddings)
  losses = []
  for cached in (memory, disk):
    loss_fn, params = _softmax_regression(cached.tokens.mean(axis=(1, 2)))
    loss = lambda p, b, k, s: loss_fn(p, {"x": b["tokens"].mean(axis=(1, 2)), **b}, k, s)  # noqa: E731
    arrays = {"tokens": cached.tokens, "labels": cached.labels}
    losses.append(fitting.fit(loss, params, arrays, fitting.FitSettings(2, 16)).losses)
  np.testing.assert_array_equal(*losses)
