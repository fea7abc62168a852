"""Weights files that lie (issue #46): non-finite values, extra prefix
tokens, duplicate zip members, keys built to take quadratic time, stride-0
views, sharded folders past the bound, `.npy` headers that declare more
than a LoRA backup holds, and the messages of `model_from_checkpoint`.
Every file is made here."""

import json
import pathlib
import shutil
import signal
import struct
import zipfile

import h5py
import numpy as np
import pytest

import keras_vit
from conftest import TINY_VIT, tiny_vit
from torch_pickles import state as _state
from torch_pickles import storage as _storage
from torch_pickles import tensor as _tensor
from torch_pickles import torch_zip
from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError
from keras_vit.weights import safetensors
from keras_vit.weights.official import official_arrays
from keras_vit.weights.pytorch import read_torch_file, read_torch_state

HUB = pathlib.Path(__file__).parent / "fixtures" / "hub"
POSEMB = "Transformer/posembed_input/pos_embedding"


def tiny_npz(path, change=None):
    """A tiny ViT's official `.npz`, with `change(arrays)` applied."""
    arrays = official_arrays(tiny_vit())
    if change:
        change(arrays)
    np.savez(path, **arrays)
    return str(path)


def timm_folder(tmp_path, change, name="timm_vit_token", config=None):
    """A copy of a timm fixture folder, its state changed by `change(state)`
    and its config.json by `config(config)`."""
    from safetensors.numpy import save_file

    folder = tmp_path / name
    shutil.copytree(HUB / name, folder)
    state = safetensors.read_safetensors(folder / "model.safetensors")
    change(state)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
              str(folder / "model.safetensors"))
    if config:
        settings = json.loads((folder / "config.json").read_text())
        config(settings)
        (folder / "config.json").write_text(json.dumps(settings))
    return str(folder)


# --- 4: non-finite weights are refused at load, in every format ----------------------

def test_nan_in_an_official_npz_is_refused_naming_file_and_key(tmp_path):
    path = tiny_npz(tmp_path / "nan.npz",
                    lambda a: a["head/bias"].__setitem__(1, np.nan))
    message = (r"nan.npz: its weight 'head/bias' holds 1 NaN and 0 infinite values "
               r"\(of 3\), and keras_vit refuses non-finite weights")
    with pytest.raises(CorruptCheckpointError, match=message):
        keras_vit.model_from_checkpoint(path)
    with pytest.raises(CorruptCheckpointError, match=message):
        tiny_vit(weights=path)


def test_inf_in_a_timm_folder_and_safetensors_file_is_named_as_timm_names_it(tmp_path):
    folder = timm_folder(tmp_path, lambda s: s["blocks.1.norm1.weight"].__setitem__(0, np.inf))
    message = "its weight 'blocks.1.norm1.weight' holds 0 NaN and 1 infinite values"
    with pytest.raises(CorruptCheckpointError, match=message):
        keras_vit.model_from_checkpoint(folder)
    with pytest.raises(CorruptCheckpointError, match=message):
        keras_vit.model_from_checkpoint(pathlib.Path(folder) / "model.safetensors",
                                        num_heads=2)


def test_nan_in_a_pytorch_file_is_refused(tmp_path):
    state = safetensors.read_safetensors(HUB / "timm_vit_token" / "model.safetensors")
    state["blocks.0.attn.qkv.weight"][3, 2] = np.nan
    items, storages = [], {}
    for i, (key, value) in enumerate(sorted(state.items())):
        storages[str(i)] = np.ascontiguousarray(value, "<f4").tobytes()
        stride = [int(np.prod(value.shape[d + 1:])) for d in range(value.ndim)]
        items.append((key, _tensor(_storage(value.size, str(i)), value.shape, stride)))
    path = torch_zip(tmp_path / "vit.pth", _state(items), storages)
    assert np.isnan(read_torch_state(path)["blocks.0.attn.qkv.weight"][3, 2])
    with pytest.raises(CorruptCheckpointError, match=(
            r"vit.pth: its weight 'blocks.0.attn.qkv.weight' holds 1 NaN and 0 infinite")):
        keras_vit.model_from_checkpoint(path, num_heads=2)


def test_nan_in_a_keras_weights_file_is_refused(tmp_path):
    path = str(tmp_path / "tiny.weights.h5")
    tiny_vit().save_weights(path)
    with h5py.File(path, "r+") as f:
        f["layers/classifier_head/vars/1"][0] = np.nan
    with pytest.raises(CorruptCheckpointError, match=(
            r"tiny.weights.h5': its weight 'layers/classifier_head/vars/1' holds 1 NaN and 0 "
            "infinite values")):
        tiny_vit(weights=path)


# --- 7: extra prefix tokens (DeiT's distillation token) are named ---------------------

def test_an_extra_prefix_token_in_an_official_npz_is_named(tmp_path):
    def distilled(arrays):
        posemb = arrays[POSEMB]
        arrays[POSEMB] = np.concatenate([posemb[:, :1], posemb], axis=1)  # 1 + 1 + 16 rows

    path = tiny_npz(tmp_path / "deit.npz", distilled)
    message = (r"position embedding of 18 rows \(the class token and 17 more\) holds 1 extra "
               r"prefix token before a 4x4 grid of patches \(a distillation token, as DeiT's "
               r"distilled models have\), but the checkpoint holds no weights of such tokens, "
               "so it is refused")
    with pytest.raises(CheckpointMismatchError, match=message):
        keras_vit.model_from_checkpoint(path)
    with pytest.raises(CheckpointMismatchError, match=message):
        tiny_vit(weights=path)


def test_a_timm_distillation_token_is_named(tmp_path):
    def distilled(state):
        posemb = state["pos_embed"]
        state["pos_embed"] = np.concatenate([posemb[:, :1], posemb], axis=1)
        state["dist_token"] = posemb[:, :1].copy()

    # since #48 a distillation token loads (tests/test_family_checkpoints.py);
    # under a name whose model has none, the file contradicts its weights
    with pytest.raises(CorruptCheckpointError, match=(
            r"vit_base_patch16_224 says distilled=False, but its weights hold a distillation "
            r"token \(dist_token\); the file and the weights must describe the same model")):
        keras_vit.model_from_checkpoint(timm_folder(tmp_path, distilled))


# --- 8: a member twice in a PyTorch zip --------------------------------------------

def test_duplicate_storage_members_are_refused(tmp_path):
    six = np.arange(6, dtype="<f4").tobytes()
    path = torch_zip(tmp_path / "twice.pth", _state([("w", _tensor(_storage(6), (6,), (1,)))]),
                     {"0": six}, extra=[("a/data/0", np.zeros(6, "<f4").tobytes())])
    with pytest.raises(CorruptCheckpointError, match=(
            "twice.pth' is a damaged PyTorch checkpoint: its member 'a/data/0' appears more "
            "than once")):
        read_torch_file(path)


# --- 11: wrapper prefixes in linear time --------------------------------------------

def test_a_key_of_many_wrapper_prefixes_is_read_in_linear_time(tmp_path):
    """1.2 MB of `module.`: 56 s when each prefix copied the key, well
    under a second now (the alarm only stops a quadratic reader)."""
    key = "module." * 180_000 + "w"
    path = torch_zip(tmp_path / "long.pth", _state([(key, _tensor(_storage(6), (6,), (1,)))]),
                     {"0": np.arange(6, dtype="<f4").tobytes()})

    def too_slow(*_):
        raise TimeoutError("stripping wrapper prefixes took over 30 s: quadratic")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(30)
    try:
        state = read_torch_state(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert list(state) == ["w"]


# --- 12: views bounded by their storage; a folder bounded as a whole ------------------

def test_a_stride_0_view_larger_than_its_storage_is_refused(tmp_path):
    path = torch_zip(tmp_path / "expand.pth",
                     _state([("w", _tensor(_storage(4), (1024, 1024), (0, 0)))]),
                     {"0": bytes(16)})
    with pytest.raises(CorruptCheckpointError, match=(
            r"a tensor of shape \(1024, 1024\) \(strides \(0, 0\)\) holds 1,048,576 elements, "
            "more than the 4 of storage 0 it views")):
        read_torch_file(path)


def test_views_are_bounded_by_the_elements_stored(tmp_path):
    """Distinct views may read a stored element twice (a slice and its
    whole), not more; the same view twice is one tensor (tied weights)."""
    six = np.arange(6, dtype="<f4").tobytes()
    tied = torch_zip(tmp_path / "tied.pth", _state(
        [(k, _tensor(_storage(6), (2, 3), (3, 1))) for k in "abc"]), {"0": six})
    read = read_torch_file(tied)
    assert read["a"] is read["c"] and read["a"].shape == (2, 3)
    views = torch_zip(tmp_path / "views.pth", _state(
        [("a", _tensor(_storage(6), (6,), (1,))), ("b", _tensor(_storage(6), (2, 3), (3, 1))),
         ("c", _tensor(_storage(6), (3, 2), (1, 3)))]), {"0": six})
    with pytest.raises(CorruptCheckpointError, match=(
            "its tensors hold 18 elements, more than 2 times the 6 its storages hold")):
        read_torch_file(views)


def test_a_sharded_folder_is_bounded_as_a_whole(tmp_path, monkeypatch):
    """Float16 shards: each shard's file and float32 arrays fit the bound,
    the folder's float32 arrays do not."""
    from safetensors.numpy import save_file

    state = safetensors.read_safetensors(HUB / "timm_vit_token" / "model.safetensors")
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(HUB / "timm_vit_token" / "config.json", folder)
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2],
              "model-00002-of-00002.safetensors": keys[1::2]}
    for shard, names in shards.items():
        save_file({k: state[k].astype("<f2") for k in names}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: s for s, names in shards.items() for k in names}}))
    total = sum(v.size * 4 for v in state.values())
    largest = max(sum(state[k].size * 4 for k in names) for names in shards.values())
    limit = (largest + total) // 2
    assert largest < limit < total
    monkeypatch.setenv("KERAS_VIT_MAX_CHECKPOINT_BYTES", str(limit))
    with pytest.raises(CorruptCheckpointError, match=(
            rf"sharded' declares {total:,} bytes of arrays, more than the limit of {limit:,}")):
        keras_vit.model_from_checkpoint(folder)


# --- 15: a LoRA backup's .npy headers are read before anything is allocated -----------

def test_a_lora_backup_with_a_huge_npy_header_is_refused(tmp_path):
    import keras

    from keras_vit.layers.lora import enable_lora
    from keras_vit.training.callbacks import BackupAndRestore

    class Killed(Exception):
        pass

    class KillAtEpoch2(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                raise Killed()

    def model():
        m = tiny_vit(classifier_activation=None)
        enable_lora(m, rank=2, seed=0)
        m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return m

    x, y = np.zeros((4, 32, 32, 3), "float32"), np.zeros(4, "int32")
    backup = str(tmp_path / "backup")
    with pytest.raises(Killed):
        model().fit(x, y, epochs=3, verbose=0,
                    callbacks=[BackupAndRestore(backup), KillAtEpoch2()])
    adapters = pathlib.Path(backup) / BackupAndRestore.ADAPTERS
    with zipfile.ZipFile(adapters) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    name = next(n for n in members if n != "__epoch__.npy")
    data = members[name]
    header_end = data.index(b"\n") + 1
    assert data[6:8] == b"\x01\x00" and b"'<f4'" in data[:header_end]  # .npy 1.0, float32
    huge = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"
    huge = huge.ljust(header_end - 11) + "\n"  # 4 TiB of float32, the member the same size
    members[name] = data[:10] + huge.encode("latin1") + data[header_end:]
    with zipfile.ZipFile(adapters, "w") as archive:
        for member, content in members.items():
            archive.writestr(member, content)
    with pytest.raises(ValueError, match=(
            rf"entry {name[:-4]!r} declares shape \(1099511627776,\) of float32 "
            r"\(4,398,046,511,104 bytes\), but the zip directory says it holds .*: not a LoRA "
            r"backup keras_vit wrote; start the run afresh \(--overwrite\)")):
        model().fit(x, y, epochs=3, verbose=0, callbacks=[BackupAndRestore(backup)])


# --- 21: messages --------------------------------------------------------------------

@pytest.mark.parametrize("path,shown", [
    (None, "NoneType None"), (b"/x.npz", r"bytes b'/x.npz' \(decode it: path.decode\(\)\)"),
    (3, "int 3")])
def test_model_from_checkpoint_names_a_path_of_the_wrong_type(path, shown):
    with pytest.raises(TypeError, match=(
            "model_from_checkpoint's `path` must be a str or os.PathLike path, an "
            rf"'hf://ORG/NAME' reference or a keras_vit.weights Checkpoint, got {shown}.")):
        keras_vit.model_from_checkpoint(path)


def test_model_from_checkpoint_takes_no_library(tmp_path):
    with pytest.raises(TypeError, match=(
            r"model_from_checkpoint takes no `library` \(the file says whose it is\); to read "
            r"a file as DINO's, pass keras_vit.weights.hub.read_hub_checkpoint\(path, "
            r"library='dino'\) as its `path`.")):
        keras_vit.model_from_checkpoint(tiny_npz(tmp_path / "t.npz"), library="dino")


def test_a_safetensors_shape_no_array_can_have_is_one_sentence(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [0, 2**62],
                               "data_offsets": [0, 0]}}).encode()
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(CorruptCheckpointError, match=(
            r"big.safetensors': tensor 'w' has shape \[0, 4611686018427387904\], whose "
            "dimensions multiply past the 2\\*\\*63 bytes any float32 array can have")):
        safetensors.read_safetensors(path)


def test_a_string_array_in_a_keras_weights_file_is_one_sentence(tmp_path):
    path = str(tmp_path / "tiny.weights.h5")
    tiny_vit().save_weights(path)
    with h5py.File(path, "r+") as f:
        del f["layers/classifier_head/vars/1"]
        f["layers/classifier_head/vars/1"] = np.array([b"a", b"b", b"c"])
    with pytest.raises(CorruptCheckpointError, match=(
            r"tiny.weights.h5' holds array 'layers/classifier_head/vars/1' as \|S1, where "
            "the model's is float32: it was not written by model.save_weights of this model")):
        keras_vit.VisionTransformer(**TINY_VIT, weights=path)


def test_a_timm_folder_without_position_embedding_is_told_in_timms_names(tmp_path):
    folder = timm_folder(tmp_path, lambda s: s.pop("pos_embed"),
                         config=lambda c: c["model_args"].update(pos_embed="none"))
    with pytest.raises(CheckpointMismatchError, match=(
            r"has no learned position embedding \(model_args.pos_embed='none', no 'pos_embed' "
            r"tensor\), which every keras_vit ViT adds")) as info:
        keras_vit.model_from_checkpoint(folder)
    assert "Transformer/" not in str(info.value)
