"""keras_vit.data: sources, presets, augmentation invariants, sharding."""

import hashlib

import numpy as np
import pytest
import tensorflow as tf

from data_helpers import CLASSES, make_folder
from keras_vit import data
from keras_vit.data import augment


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    return str(root), make_folder(str(root))


def digest(pixels):
    return hashlib.sha1(np.asarray(pixels, "uint8").tobytes()).hexdigest()


def collect(dataset):
    images, labels = [], []
    for x, y in dataset:
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


def test_folder_eval_pipeline_gives_the_source_pixels_and_labels(folder):
    root, truth = folder
    dataset, info = data.make_dataset(f"folder:{root}", image_size=64, batch_size=5,
                                      holdout=0, with_info=True)
    images, labels = collect(dataset)
    assert info.class_names == list(CLASSES) and info.num_examples == 18
    assert images.dtype == np.float32 and images.shape == (18, 64, 64, 3)
    assert labels.shape == (18, 3) and (labels.sum(1) == 1).all()
    got = sorted((int(y.argmax()), digest(x)) for x, y in zip(images, labels, strict=True))
    expected = sorted((label, digest(pixels)) for label, pixels in truth.values())
    assert got == expected


@pytest.mark.parametrize("default, size, expected", [
    ("finetune", 32, ("small", "images of 32 px, <= 64: milder crops than 'finetune', random "
                               "flips; for digits or characters, where a flip changes the "
                               "class, use --preset digits")),
    ("finetune", (224, 224), ("finetune", "the recipe's")),
    ("medium2", 32, ("medium2", "the recipe's")),  # RandAugment + MixUp: kept
])
def test_the_automatic_preset_says_why_and_what_digits_want(default, size, expected):
    from keras_vit.data.presets import auto_preset

    assert auto_preset(default, size) == expected


@pytest.mark.parametrize("preset", ["eval", "eval_crop", "finetune", "light1", "medium2", "strong2"])
def test_presets_shapes_dtypes_ranges(folder, preset):
    root, _ = folder
    dataset = data.make_dataset(f"folder:{root}", image_size=(48, 40), batch_size=4,
                                training=True, preset=preset, seed=0)
    x, y = next(iter(dataset))
    assert x.shape == (4, 48, 40, 3) and x.dtype == tf.float32
    assert y.shape == (4, 3) and y.dtype == tf.float32
    assert 0.0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 255.0
    np.testing.assert_allclose(tf.reduce_sum(y, 1), 1.0, rtol=1e-6)


def test_the_pipeline_traces_its_functions_as_written(folder, monkeypatch):
    """No function of a pipeline goes through AutoGraph (`graph.as_written`:
    its rewrite cost every training start 1.5-2.6 s, benchmarks/pipeline_start.py):
    RandAugment, MixUp, the skip-corrupt path and the evaluation path."""
    import doctest

    from tensorflow.python.autograph.impl import api  # where AutoGraph converts a function

    from keras_vit.data import graph as _graph

    converted, convert = [], api._convert_actual
    monkeypatch.setattr(api, "_convert_actual", lambda entity, program_ctx: (
        converted.append(entity), convert(entity, program_ctx))[1])
    root, _ = folder
    for preset, split, skip in (("medium2", "train", True), ("medium2", "train", False),
                                (None, "train", False)):
        dataset = data.make_dataset(f"folder:{root}", split, image_size=32, batch_size=4,
                                    training=preset is not None, preset=preset, seed=0,
                                    skip_corrupt=skip)
        next(iter(dataset))
    assert converted == []
    tf.data.Dataset.range(2).map(lambda x: x + 1)  # the probe sees what Dataset.map converts
    assert len(converted) == 1
    assert doctest.testmod(_graph).failed == 0


def test_same_seed_same_batches_other_seed_other_batches(folder):
    root, _ = folder

    def first_batches(seed):
        ds = data.make_dataset(f"folder:{root}", image_size=32, batch_size=6,
                               training=True, preset="strong2", seed=seed)
        return [b.numpy() for b, _ in ds.take(2)]

    a, b, c = first_batches(5), first_batches(5), first_batches(6)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


def test_randaugment_draws_an_op_per_image():
    """Different images of one batch get different ops: the op index is a
    function of each image's own seed."""
    seeds = tf.random.experimental.stateless_split(tf.constant([1, 2], tf.int64), 32)
    firsts = {int(augment.randaugment_choices(2, s)[0][0]) for s in seeds}
    assert len(firsts) >= 8  # 32 draws over 16 ops
    image = tf.constant(np.random.default_rng(0).integers(0, 256, (32, 32, 3)), tf.float32)
    outputs = {digest(augment.randaugment(image, 2, 10, s).numpy()) for s in seeds[:8]}
    assert len(outputs) >= 6


def test_randaugment_in_a_batch_gives_different_ops_for_identical_images(tmp_path):
    """In the pipeline: eight copies of one image, RandAugment only."""
    root = tmp_path / "same" / "only"
    root.mkdir(parents=True)
    pixels = np.random.default_rng(1).integers(0, 256, (32, 32, 3)).astype("uint8")
    for i in range(8):
        (root / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    preset = data.Preset("ra_only", training=False, randaugment=(1, 10))
    # training=False keeps the eval resize (no crop, no flip): only RandAugment differs
    x, _ = next(iter(data.make_dataset(f"folder:{tmp_path / 'same'}", image_size=32,
                                       batch_size=8, preset=preset, seed=3)))
    assert len({digest(img) for img in x.numpy()}) >= 4


@pytest.mark.parametrize("name", augment.RANDAUGMENT_OPS)
def test_every_randaugment_op_keeps_shape_dtype_and_range(name):
    image = tf.constant(np.random.default_rng(2).integers(0, 256, (40, 24, 3)), tf.float32)
    index = augment.RANDAUGMENT_OPS.index(name)
    out = augment._apply_op(tf.constant(index), image, tf.constant(15.0),
                            tf.constant([3, 4], tf.int64))
    assert out.shape == (40, 24, 3) and out.dtype == tf.float32
    assert 0.0 <= float(tf.reduce_min(out)) and float(tf.reduce_max(out)) <= 255.0


def test_randaugment_known_answers():
    image = tf.reshape(tf.range(48, dtype=tf.float32) * 5, (4, 4, 3))
    op = {n: i for i, n in enumerate(augment.RANDAUGMENT_OPS)}
    seed = tf.constant([0, 0], tf.int64)

    def run(name, level):
        return augment._apply_op(tf.constant(op[name]), image, tf.constant(float(level)), seed).numpy()

    np.testing.assert_array_equal(run("Invert", 10), 255 - image.numpy())
    # solarize threshold int(15/10*256)=384 > 255: no pixel changes
    np.testing.assert_array_equal(run("Solarize", 15), image.numpy())
    # posterize level 5: int(0.5*4)=2 bits kept
    np.testing.assert_array_equal(run("Posterize", 5), (image.numpy().astype(int) >> 6 << 6))
    # brightness factor 0.1 at level 0 (magnitude 0 is not a no-op)
    np.testing.assert_allclose(run("Brightness", 0), image.numpy() * 0.1, rtol=1e-6)
    ac = run("AutoContrast", 10)
    assert ac.min() == 0 and ac.max() == 255


def test_mixup_and_cutmix_labels_sum_to_one():
    images = tf.random.uniform((8, 16, 16, 3), maxval=255.0, seed=1)
    labels = tf.one_hot(tf.range(8) % 3, 3)
    seed = tf.constant([7, 8], tf.int64)
    mixed, mixed_labels = augment.mixup(images, labels, 0.5, seed)
    np.testing.assert_allclose(tf.reduce_sum(mixed_labels, 1), 1.0, rtol=1e-6)
    lam = float(tf.reduce_max(mixed_labels[0]))
    assert lam >= 0.5  # max(lambda, 1 - lambda)
    np.testing.assert_allclose(mixed[0], lam * images[0] + (1 - lam) * images[7], rtol=1e-5)
    cut, cut_labels = augment.cutmix(images, labels, 1.0, seed)
    np.testing.assert_allclose(tf.reduce_sum(cut_labels, 1), 1.0, rtol=1e-6)
    pasted = float(tf.reduce_mean(tf.cast(cut[0] != images[0], tf.float32)))
    from_neighbour = float(cut_labels[0, int(tf.argmax(labels[7]))])
    assert abs(pasted - from_neighbour) < 0.05


def test_mixup_preset_in_the_pipeline(folder):
    root, _ = folder
    preset = data.Preset("mix", True, mixup=0.5, cutmix=1.0, label_smoothing=0.1)
    _, y = next(iter(data.make_dataset(f"folder:{root}", image_size=32, batch_size=6,
                                       training=True, preset=preset, seed=0)))
    np.testing.assert_allclose(tf.reduce_sum(y, 1), 1.0, rtol=1e-5)
    assert float(tf.reduce_min(y)) >= 0.1 / 3 - 1e-6  # smoothed


def test_sharding_over_two_workers_is_disjoint_and_complete(folder):
    root, truth = folder
    seen = []
    for worker in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker,
                                             num_replicas_in_sync=2)
        dataset, info = data.make_dataset(f"folder:{root}", image_size=64, batch_size=4,
                                          input_context=context, holdout=0, with_info=True)
        assert info.batch_size == 2 and info.global_batch_size == 4
        images, _ = collect(dataset)
        assert images.shape[0] == 9
        seen.append({digest(x) for x in images})
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == {digest(p) for _, p in truth.values()}


def test_corrupt_file_fails_by_default_with_its_name(tmp_path):
    truth = make_folder(str(tmp_path), per_class=2)
    victim = sorted(p for p in truth if p.endswith(".jpg"))[0]
    data_bytes = open(victim, "rb").read()
    with open(victim, "wb") as f:
        f.write(data_bytes[: len(data_bytes) // 2])  # truncated JPEG
    (tmp_path / "china" / "notes.jpg").write_text("not an image")
    dataset = data.make_dataset(f"folder:{tmp_path}", image_size=32, batch_size=2, holdout=0)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        collect(dataset)
    assert "Corrupt or non-image file" in str(info.value)
    assert ("notes.jpg" in str(info.value)) or (victim.split("/")[-1] in str(info.value))
    dataset, info = data.make_dataset(f"folder:{tmp_path}", image_size=32, batch_size=2,
                                      skip_corrupt=True, holdout=0, with_info=True)
    images, _ = collect(dataset)
    assert images.shape[0] == 6 - 1
    assert info.skipped_corrupt == 2


def test_tfds_source_with_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=10):
        dataset, info = data.make_dataset("tfds:mnist", "train", image_size=32,
                                          batch_size=5, with_info=True)
        images, labels = collect(dataset)
    assert images.shape == (10, 32, 32, 3) and labels.shape == (10, 10)
    assert info.class_names == [str(i) for i in range(10)]


def test_tfds_not_prepared_offline(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(ValueError, match=r"TFDS dataset 'mnist' is not prepared in .* and cannot "
                                         r"be downloaded here\. Prepare it where the data is "
                                         r"reachable \(`tfds build mnist`"):
        data.make_dataset("tfds:mnist", data_dir=str(tmp_path))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"Unknown data source scheme 'csv' in 'csv:/x'; valid: "
                                         r"'tfds', 'tfrecord', 'folder'\."):
        data.make_dataset("csv:/x")
    with pytest.raises(ValueError, match=r"Data source '/data/x' has no scheme"):
        data.make_dataset("/data/x")
    with pytest.raises(ValueError, match=r"Unknown preset 'heavy'; allowed: "):
        data.make_dataset("folder:/nowhere", preset="heavy")
    with pytest.raises(ValueError, match=r"RandAugment magnitude must be in \[0, 30\]"):
        data.make_dataset("folder:/nowhere", preset=data.Preset("x", True, randaugment=(2, 31)))
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive integer, got 0\."):
        data.make_dataset("folder:/nowhere", batch_size=0)
    with pytest.raises(ValueError, match=r"Image folder not found: '/nowhere'\."):
        data.make_dataset("folder:/nowhere")
