"""keras_vit.training.memory: a training step that cannot fit in the host's
memory is refused before the first step, with the batch that fits (on the
CPU the OOM killer ended such a run mid-epoch without a word: `keras-vit
train --model ViTTi16 --data folder:DIGITS`, 384 px, batch 512, on 24 GB)."""

import json
import os
import re

import keras
import pytest
from data_helpers import make_folder

import keras_vit
from conftest import run_cli, tiny_keras_file
from keras_vit.training import memory, trainer

pytestmark = pytest.mark.backends

# 48 px in patches of 8: 36 patches and a class token.
TOKENS, WIDTH, HEADS, MLP = 37, 16, 2, 32


def _vit(layers=2, **kwargs):
    return keras_vit.VisionTransformer(
        patch_size=8, hidden_size=WIDTH, num_layers=layers, num_heads=HEADS, mlp_dim=MLP,
        input_shape=(48, 48, 3), classes=3, **kwargs)


def _per_image(model):
    return memory.estimate_training_memory(model, 1).per_image


# (JAX's XLA step on the CPU keeps 1.15 times the activations and 4 float32
# attention arrays per head, torch 1.1 times the activations and 1.5 arrays,
# TensorFlow 1 and 1.5: benchmarks/train_memory.py.)
ACTIVATIONS, COPIES = {"jax": (1.15, 4.0), "torch": (1.1, 1.5)}.get(
    keras.backend.backend(), (1.0, 1.5))
BLOCK = (ACTIVATIONS * 4 * (8 * TOKENS * WIDTH + 3 * TOKENS * MLP)
         + 4 * COPIES * HEADS * TOKENS**2)


@pytest.mark.parametrize("attention", ["fused", "dot_product"])
def test_a_transformer_block_keeps_its_activations_and_float32_attention_weights(attention):
    """(Counted for dot_product too: PyTorch's SDPA on the CPU kept as much
    for ViT-L/16.)"""
    assert _per_image(_vit(3, attention=attention)) - _per_image(_vit(2, attention=attention)) \
        == pytest.approx(BLOCK, abs=1)


def test_a_rematerialised_block_keeps_its_input_and_one_block_is_recomputed():
    """On TensorFlow; on JAX and torch remat measured little saving on the
    CPU, and the block counts in full."""
    plain, remat = _vit(4), _vit(4, remat=True)
    saved = 4 * BLOCK - (4 * 4 * TOKENS * WIDTH + BLOCK)
    assert memory.remat_saves_memory() == (keras.backend.backend() == "tensorflow")
    assert _per_image(plain) - _per_image(remat) == pytest.approx(
        saved if memory.remat_saves_memory() else 0, abs=1)


def test_a_mixer_block_keeps_its_token_and_channel_activations():
    def mixer(blocks):
        return keras_vit.MLPMixer(patch_size=8, hidden_size=WIDTH, num_blocks=blocks,
                                  tokens_mlp_dim=24, channels_mlp_dim=MLP,
                                  input_shape=(48, 48, 3), classes=3)

    patches = 36
    assert _per_image(mixer(3)) - _per_image(mixer(2)) == pytest.approx(
        ACTIVATIONS * 4 * (8 * patches * WIDTH + 3 * (WIDTH * 24 + patches * MLP)), abs=1)


def test_the_fixed_part_counts_gradients_optimizer_slots_and_copies():
    model = _vit()
    weights = 4 * sum(int(w.numpy().size) for w in model.trainable_weights)
    sgd = memory.estimate_training_memory(model, 8, optimizer_slots=1)
    adamw_ema = memory.estimate_training_memory(model, 8, optimizer_slots=2, weight_copies=1)
    assert sgd.fixed == memory.RUNTIME_BYTES + 2 * weights
    assert adamw_ema.fixed - sgd.fixed == 2 * weights
    assert sgd.total == sgd.fixed + 8 * sgd.per_image
    assert sgd.largest_batch(sgd.fixed + 5.5 * sgd.per_image) == 5
    assert sgd.largest_batch(sgd.fixed - 1) == 0


def test_a_hybrid_counts_the_runtime_of_its_resnet():
    hybrid = keras_vit.VisionTransformer(
        patch_size=1, hidden_size=WIDTH, num_layers=1, num_heads=HEADS, mlp_dim=MLP,
        resnet_layers=(1,), input_shape=(32, 32, 3), classes=3)
    weights = 4 * sum(int(w.numpy().size) for w in hybrid.trainable_weights)
    assert memory.estimate_training_memory(hybrid, 1, optimizer_slots=1).fixed \
        == memory.RUNTIME_BYTES_RESNET + 2 * weights


def test_a_subclassed_model_is_not_counted():
    class Net(keras.Model):
        def call(self, x):
            return x

    assert memory.estimate_training_memory(Net(), 8) is None


def test_the_available_memory_is_read_from_the_kernel():
    available = memory.available_memory()
    assert available is None or 0 < available < 1 << 50


def test_a_step_that_fits_passes_and_one_that_does_not_names_the_batch_that_fits():
    model = _vit(attention="fused")
    estimate = memory.estimate_training_memory(model, 512, optimizer_slots=1)
    arguments = dict(image_size=48, name="tiny", optimizer_slots=1)
    assert memory.check_host_memory(model, 512, available=estimate.total,
                                    **arguments) == estimate
    available = estimate.fixed + 100.5 * estimate.per_image
    with pytest.raises(ValueError) as error:
        memory.check_host_memory(model, 512, available=available, can_remat=True,
                                 **arguments)
    assert str(error.value) == (
        f"A training step of tiny at 48 px with batches of 512 images needs about "
        f"{estimate.total / 1e9:,.1f} GB of memory (estimated), and {available / 1e9:,.1f} GB "
        "is available; pass --batch-size 100 or less, --batch-size 64 "
        "--gradient-accumulation-steps 8 (the same 512 images per update), or --remat "
        "(--no-memory-check trains anyway).")
    # already accumulating 2 batches per update: 16 then; no --remat to offer
    with pytest.raises(ValueError, match=(
            r"; pass --batch-size 100 or less, or --batch-size 64 "
            r"--gradient-accumulation-steps 16 \(the same 1024 images per update\) "
            r"\(--no-memory-check trains anyway\)\.$")):
        memory.check_host_memory(model, 512, available=available,
                                 gradient_accumulation_steps=2, **arguments)
    with pytest.raises(ValueError, match=(
            r"is available; not even one image fits: use a smaller --image-size, --remat or "
            r"a machine with more memory \(--no-memory-check trains anyway\)\.$")):
        memory.check_host_memory(model, 512, available=estimate.fixed, can_remat=True,
                                 **arguments)


def test_train_refuses_before_the_first_step_and_leaves_the_folder_free(
        tmp_path, monkeypatch):
    """The CLI's refusal is one line before any work; the folder then takes
    the corrected run without --overwrite (no "running" record is left),
    and --no-memory-check trains anyway."""
    make_folder(str(tmp_path / "data"), per_class=6, size=32)
    tiny_keras_file(tmp_path / "tiny.keras", classifier="gap", classifier_activation=None)
    monkeypatch.setattr(memory, "available_memory", lambda: 1)
    out = tmp_path / "run"
    argv = ["train", "--model", tmp_path / "tiny.keras", "--data", f"folder:{tmp_path / 'data'}",
            "--recipe", "scratch", "--epochs", "1", "--out", out, "--quiet", "--json"]
    refused = run_cli(*argv, "--batch-size", "8")
    assert refused.code == 2 and refused.out == ""
    assert re.fullmatch(
        r"keras-vit: error: A training step of tiny\.keras at 32 px with batches of 8 images "
        r"needs about 0\.[0-9] GB of memory \(estimated\), and 0\.0 GB is available; not "
        r"even one image fits: use a smaller --image-size or a machine with more memory "
        r"\(--no-memory-check trains anyway\)\.\n", refused.err.splitlines(True)[-1])
    assert os.listdir(out) == [".run.lock"]
    anyway = run_cli(*argv, "--batch-size", "4", "--no-memory-check")
    assert anyway.code == 0 and json.loads(anyway.out)["summary"]["memory"] is None

    monkeypatch.undo()  # the API, checked: the summary says the estimate
    results = trainer.train(str(tmp_path / "tiny.keras"), f"folder:{tmp_path / 'data'}",
                            recipe="scratch", epochs=1, batch_size=4, verbose=0,
                            out=str(tmp_path / "run2"))
    row = results["summary"]["memory"]
    assert 0 < row["estimated"] < row["available"]
    assert re.search(r"\n  memory +about 0\.[0-9] GB per step \(estimated\), [0-9.,]+ GB "
                     r"available\n", trainer.format_summary(results["summary"]))
