"""PyTorch checkpoints (`keras_vit.weights.pytorch`): files written here by
torch itself load with the source library's logits; training checkpoints,
wrappers and shards are unwrapped; crafted files never run anything and
damaged ones are one clear error.

The timm and transformers weights are the committed Hub fixtures'
(`tests/fixtures/hub`, with reference logits from timm 1.0.31 and
transformers 5.23), written again with `torch.save` as older repositories
and training scripts hold them."""

import argparse
import json
import logging
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import keras_vit
from conftest import predict, process_env
from keras_vit.errors import CorruptCheckpointError, UnsupportedCheckpointError
from keras_vit.weights import hub, hub_layout, safetensors
from torch_pickles import s as _s
from torch_pickles import state as _state
from torch_pickles import storage as _storage
from torch_pickles import tensor as _tensor
from keras_vit.weights.pytorch import read_torch_file, read_torch_state

torch = pytest.importorskip("torch")

HUB = pathlib.Path(__file__).parent / "fixtures" / "hub"
REFS = np.load(HUB / "references.npz")
PHOTOS = REFS["photos/32"].astype("float32")


def tensors(name):
    """The fixture's state dict as torch tensors."""
    state = safetensors.read_safetensors(HUB / name / "model.safetensors")
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


def assert_parity(got, reference):
    diff = float(np.abs(np.asarray(got) - reference).max())
    assert diff <= 1e-4 * max(1.0, float(np.abs(reference).max())), diff


def torch_folder(tmp_path, name):
    """The Hub fixture as older repositories hold it: config.json (and the
    preprocessor config) with `pytorch_model.bin` written by torch.save."""
    folder = tmp_path / name
    folder.mkdir()
    for file in (HUB / name).iterdir():
        if file.suffix == ".json":
            shutil.copy(file, folder)
    torch.save(tensors(name), folder / "pytorch_model.bin")
    return folder


@pytest.mark.backends
@pytest.mark.parametrize("name", ["timm_vit_token", "timm_vit_gap", "timm_hybrid", "timm_mixer",
                                  "transformers_vit_classifier"])
def test_a_pytorch_model_bin_folder_gives_the_source_librarys_logits(tmp_path, name):
    model = keras_vit.model_from_checkpoint(torch_folder(tmp_path, name),
                                            input_shape=(32, 32, 3), classifier_activation=None)
    assert_parity(predict(model, PHOTOS), REFS[f"{name}/32/logits"])


def test_safetensors_are_preferred_when_a_folder_has_both(tmp_path, monkeypatch):
    folder = torch_folder(tmp_path, "timm_vit_token")
    shutil.copy(HUB / "timm_vit_token" / "model.safetensors", folder)
    monkeypatch.setattr(hub_layout, "read_torch_state", lambda *a, **k: pytest.fail("read the .bin"))
    keras_vit.model_from_checkpoint(folder)


def test_a_bare_state_dict_through_a_builder(tmp_path):
    path = tmp_path / "vit.pth"
    torch.save(tensors("timm_vit_token"), path)
    model = keras_vit.VisionTransformer(
        patch_size=8, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64,
        input_shape=(32, 32, 3), classifier_activation=None, weights=str(path))
    assert_parity(predict(model, PHOTOS), REFS["timm_vit_token/32/logits"])


def test_a_timm_training_checkpoint_gives_its_state_dict_or_its_ema(tmp_path, caplog):
    """timm train.py's checkpoint: the weights under `state_dict`, an EMA
    copy, the optimizer's state and an `argparse.Namespace`, which is kept
    as an inert record and never imported."""
    state = tensors("timm_vit_token")
    ema = {k: v + 1 for k, v in state.items()}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9)
    path = tmp_path / "checkpoint-3.pth.tar"
    torch.save({"epoch": 3, "arch": "vit_base_patch16_224", "state_dict": state,
                "state_dict_ema": ema, "optimizer": optimizer.state_dict(),
                "args": argparse.Namespace(lr=0.1), "version": 2}, path)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        read = read_torch_state(path)
    assert f"read 'state_dict' (32 tensors) of {str(path)!r}; also in the file: epoch, " \
           "arch, state_dict_ema, optimizer, args, version" in caplog.text
    np.testing.assert_array_equal(read["cls_token"], state["cls_token"].numpy())
    np.testing.assert_array_equal(read_torch_state(path, ema=True)["cls_token"],
                                  ema["cls_token"].numpy())
    assert repr(read_torch_file(path)["args"]) == "<argparse.Namespace (not loaded)>"
    model = keras_vit.model_from_checkpoint(path, num_heads=2, input_shape=(32, 32, 3),
                                            classifier_activation=None)  # no config.json
    assert_parity(predict(model, PHOTOS), REFS["timm_vit_token/32/logits"])


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod."])
def test_wrapper_prefixes_are_stripped(tmp_path, prefix):
    path = tmp_path / "ddp.pth"
    torch.save({"model": {prefix + k: v for k, v in tensors("timm_mixer").items()}}, path)
    assert sorted(read_torch_state(path)) == sorted(tensors("timm_mixer"))


def test_dino_teacher_backbone_is_read_and_its_head_left_out(tmp_path, caplog):
    """DINO's training checkpoint: `teacher` and `student`, each a
    MultiCropWrapper (`backbone.` + the projection `head.`)."""
    state = tensors("timm_vit_gap")
    state = {k: v for k, v in state.items() if not k.startswith("head.")}  # DINO: no classifier
    wrapped = {**{"backbone." + k: v for k, v in state.items()},
               "head.mlp.0.weight": torch.zeros(4, 32), "head.last_layer.weight_g": torch.ones(1)}
    path = tmp_path / "checkpoint.pth"
    torch.save({"student": wrapped, "teacher": wrapped, "epoch": 100}, path)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        read = read_torch_state(path)
    assert sorted(read) == sorted(state)
    assert "read 'teacher' (" in caplog.text
    assert "the teacher's projection head (2 tensors)" in caplog.text


def test_sharded_pytorch_model_bin(tmp_path):
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(HUB / "timm_vit_token" / "config.json", folder)
    state = tensors("timm_vit_token")
    keys = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": keys[:10],
              "pytorch_model-00002-of-00002.bin": keys[10:]}
    for file, names in shards.items():
        torch.save({k: state[k] for k in names}, folder / file)
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, names in shards.items() for k in names}}))
    model = keras_vit.model_from_checkpoint(folder, input_shape=(32, 32, 3),
                                            classifier_activation=None)
    assert_parity(predict(model, PHOTOS), REFS["timm_vit_token/32/logits"])


def test_dtypes_and_views(tmp_path):
    """float16, bfloat16 and float64 come out float32, integers as they
    are; a transposed view and a slice read their part of the storage."""
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"half": base.half(), "bf16": base.bfloat16(), "double": base.double(),
             "long": torch.arange(3), "t": base.t(), "row": base[1], "bool": base > 5}
    path = tmp_path / "d.pth"
    torch.save(state, path)
    read = read_torch_file(path)
    for key, value in state.items():
        expected = value.float().numpy() if value.is_floating_point() else value.numpy()
        np.testing.assert_array_equal(read[key], expected)
        assert read[key].dtype == expected.dtype, key


def test_the_reader_imports_no_torch(tmp_path):
    path = tmp_path / "vit.pth"
    torch.save(tensors("timm_vit_token"), path)
    code = ("import sys; from keras_vit.weights.pytorch import read_torch_state; "
            f"read_torch_state({str(path)!r}); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=process_env(), check=True)
    assert result.stdout.strip() == "False"


# --- crafted and damaged files ------------------------------------------------------

def torch_zip(path, payload, storages=None, compress=zipfile.ZIP_STORED):
    """A file in torch.save's layout with `payload` (bytes) as data.pkl."""
    with zipfile.ZipFile(path, "w", compress) as archive:
        archive.writestr("archive/data.pkl", payload)
        for key, data in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return path


class Gadget:
    """Pickles as a call of `function(*args)`: what a malicious file does."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


class SetState:
    """Pickles as object creation plus a `__setstate__` call with a payload."""

    def __reduce__(self):
        return subprocess.Popen, (["true"],), {"marker": "state"}


@pytest.mark.parametrize("gadget", [
    lambda marker: Gadget(os.system, f"touch {marker}"),
    lambda marker: Gadget(eval, f"open({str(marker)!r}, 'w')"),
    lambda marker: Gadget(subprocess.Popen, ["touch", str(marker)]),
    lambda marker: SetState(),
], ids=["os.system", "builtins.eval", "subprocess.Popen", "__setstate__"])
def test_a_malicious_pickle_never_runs(tmp_path, gadget):
    marker = tmp_path / "ran"
    payload = pickle.dumps({"cls_token": gadget(marker)}, protocol=2)
    path = torch_zip(tmp_path / "evil.pth", payload)
    for load in (read_torch_state, keras_vit.model_from_checkpoint,
                 lambda p: keras_vit.ViTS16(weights=str(p))):
        with pytest.raises(ValueError, match=r"'cls_token' in its state dict is the global "
                                             r"'[a-z_.A-Z]+' \(not loaded\), not a tensor"):
            load(path)
    assert not marker.exists()


def test_a_global_where_a_storage_belongs_is_named(tmp_path):
    """A tensor rebuilt from something other than a storage of the file."""

    class Rebuild:
        def __reduce__(self):
            import torch._utils as tu
            return tu._rebuild_tensor_v2, (Gadget(os.getcwd), 0, (1,), (1,), False, None)

    path = torch_zip(tmp_path / "evil.pth", pickle.dumps({"w": Rebuild()}, protocol=2))
    with pytest.raises(ValueError, match="a tensor's data is the global 'posix.getcwd' "
                                         r"\(not loaded\), not a storage of the file"):
        read_torch_file(path)


def storage_pickle(shape, stride, offset=0, numel=4, kind="FloatStorage"):
    """data.pkl of {"w": tensor} as torch writes it, with its view fields."""

    class Persistent(pickle.Pickler):
        def persistent_id(self, obj):  # the storage type pickles as a global, as torch's
            return ("storage", getattr(torch, kind), "0", "cpu", numel) \
                if obj == "STORAGE" else None

    class Rebuild:
        def __reduce__(self):
            import torch._utils as tu
            return tu._rebuild_tensor_v2, ("STORAGE", offset, shape, stride, False, None)

    import io
    buffer = io.BytesIO()
    Persistent(buffer, protocol=2).dump({"w": Rebuild()})
    return buffer.getvalue()


@pytest.mark.parametrize("shape,stride,offset,data,message", [
    ((4,), (1,), 0, 8, "data/0 holds 8 bytes, fewer than its tensors need (16)"),
    ((2, 2), (2, 1), 1, 16, "a tensor of shape (2, 2) (strides (2, 1), offset 1) reaches "
                            "element 4 of storage 0, which has 4"),
    ((4,), (2,), 0, 16, "reaches element 6 of storage 0"),
    ((10**6, 10**6), (0, 0), 0, 16, "more than"),
])
def test_damaged_tensors_are_one_clear_error(tmp_path, shape, stride, offset, data, message):
    path = torch_zip(tmp_path / "bad.pth", storage_pickle(shape, stride, offset),
                     {"0": bytes(data)})
    with pytest.raises(CorruptCheckpointError, match=message.replace("(", r"\(")
                       .replace(")", r"\)")):
        read_torch_file(path)


def test_truncated_and_recompressed_files(tmp_path):
    good = tmp_path / "good.pth"
    torch.save(tensors("timm_mixer"), good)
    cut = tmp_path / "cut.pth"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises((CorruptCheckpointError, UnsupportedCheckpointError)):
        keras_vit.model_from_checkpoint(cut)
    bomb = torch_zip(tmp_path / "bomb.pth", storage_pickle((4,), (1,)),
                     {"0": bytes(16)}, compress=zipfile.ZIP_DEFLATED)
    with pytest.raises(CorruptCheckpointError, match="is compressed; torch.save stores its "
                                                     "members uncompressed"):
        read_torch_file(bomb)


def test_no_state_dict_is_named(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"epoch": 3, "losses": [0.5]}, path)
    with pytest.raises(UnsupportedCheckpointError, match=(
            "holds no tensor state dict: looked for a dict of tensors, then under "
            "'state_dict', 'model', 'module', 'model_state_dict', 'teacher'; the file holds "
            "epoch, losses.")):
        keras_vit.model_from_checkpoint(path)


def test_ema_through_the_builders_model_from_checkpoint_and_the_cli(tmp_path):
    """`ema=True` (`--ema`) loads `state_dict_ema`; weights without an EMA
    copy say so."""
    from conftest import run_cli

    folder = torch_folder(tmp_path, "timm_vit_token")
    state = tensors("timm_vit_token")
    path = folder / "pytorch_model.bin"
    torch.save({"state_dict": {k: v * 0 for k, v in state.items()}, "state_dict_ema": state},
               path)
    model = keras_vit.model_from_checkpoint(folder, ema=True, input_shape=(32, 32, 3),
                                            classifier_activation=None)
    assert_parity(predict(model, PHOTOS), REFS["timm_vit_token/32/logits"])
    ema_model = keras_vit.VisionTransformer(
        patch_size=8, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64,
        input_shape=(32, 32, 3), classifier_activation=None, weights=str(folder), ema=True)
    assert_parity(predict(ema_model, PHOTOS), REFS["timm_vit_token/32/logits"])
    with pytest.raises(ValueError, match="ema=True reads the EMA weights of a PyTorch training "
                                         r"checkpoint \(state_dict_ema / model_ema\); '.*"
                                         "timm_vit_token' is a folder of model.safetensors"):
        keras_vit.model_from_checkpoint(HUB / "timm_vit_token", ema=True)
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"\(state_dict_ema / model_ema\); '.*pytorch_model.bin' "
                                         "is a state dict of 32 tensors, which holds one set"):
        keras_vit.model_from_checkpoint(folder, ema=True)
    with pytest.raises(TypeError, match="`ema` must be True or False, got 'yes'."):
        keras_vit.model_from_checkpoint(folder, ema="yes")
    image = tmp_path / "photo.png"
    from PIL import Image
    Image.fromarray(PHOTOS[0].astype("uint8")).save(image)
    torch.save({"state_dict": {k: v * 0 for k, v in state.items()}, "state_dict_ema": state},
               path)
    result = run_cli("predict", str(image), "--weights", str(folder), "--weights-ema", "--top",
                     "1", "--json")
    assert result.code == 0, result.err
    plain = run_cli("predict", str(image), "--weights", str(folder), "--top", "1", "--json")
    assert plain.code == 0 and plain.out != result.out  # the zeroed weights predict otherwise


SIX = np.arange(6, dtype="<f4").tobytes()
_DAG = b"\x80\x02]q\x00" + b"".join(b"](h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"eq"
                                   + bytes([i]) for i in range(1, 41)) + b"."


@pytest.mark.parametrize("payload,byteorder,error,message", [
    # BUILD on the storage type: a 1 MiB-per-element dtype past the byte bound
    (_state([("w", _tensor(_storage(build=b"}(" + _s("dtype") + _s("x") + b"ub")))]),
     b"little", CorruptCheckpointError, "BUILD on StorageType"),
    # 2**40 lists from 366 bytes, shared by memo references
    (_DAG, b"little", CorruptCheckpointError, "nests deeper than 32 levels"),
    (_state([("w", _tensor(_storage(), shape=(2**70,), stride=(0,)))]), b"little",
     CorruptCheckpointError, "which do not describe a view"),
    (b"\x80\x02\x82\x05.", b"little", CorruptCheckpointError, "unregistered extension code"),
    (_state([("w", _tensor(_storage()))]), b"BIG", CorruptCheckpointError,
     "its byteorder is b'BIG', not little or big"),
    (_state([("w", _tensor(_storage(kind="ComplexFloatStorage")))]), b"little",
     UnsupportedCheckpointError, "holds tensors of torch.ComplexFloatStorage, a type keras_vit "
                                 "does not read"),
], ids=["build-hijack", "shared-lists", "huge-int", "ext-opcode", "byteorder", "complex"])
def test_crafted_pickles_are_one_error_fast(tmp_path, payload, byteorder, error, message):
    path = tmp_path / "crafted.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/data.pkl", payload)
        archive.writestr("a/byteorder", byteorder)
        archive.writestr("a/data/0", SIX)
    with pytest.raises(error, match=re.escape(message)):
        read_torch_file(path)


def test_big_endian_files_and_missing_files(tmp_path):
    path = tmp_path / "be.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/data.pkl", _state([("w", _tensor(_storage()))]))
        archive.writestr("a/byteorder", b"big")
        archive.writestr("a/data/0", np.arange(6, dtype=">f4").tobytes())
    np.testing.assert_array_equal(read_torch_file(path)["w"], np.arange(6, dtype="float32"))
    with pytest.raises(keras_vit.weights.CheckpointNotFoundError):
        hub.read_hub_checkpoint(tmp_path / "missing.pth")
    legacy = tmp_path / "old"
    legacy.mkdir()
    shutil.copy(HUB / "timm_vit_token" / "config.json", legacy)
    (legacy / "pytorch_model.bin").write_bytes(
        pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2))
    with pytest.raises(UnsupportedCheckpointError, match="is a legacy PyTorch checkpoint"):
        keras_vit.model_from_checkpoint(legacy)


def test_weights_sniffs_a_pytorch_file_once(tmp_path, monkeypatch):
    """`weights=` tells the file's kind once; the reader does not sniff it
    again (a .pth was opened six times, now three: head, zip directory, read)."""
    from keras_vit.weights import pytorch

    path = tmp_path / "vit.pth"
    torch.save(tensors("timm_vit_token"), path)
    monkeypatch.setattr(pytorch, "sniff_checkpoint", lambda *a, **k: pytest.fail("sniffed twice"))
    monkeypatch.setattr(hub, "is_zip", lambda *a, **k: pytest.fail("opened to tell the kind"))
    keras_vit.VisionTransformer(patch_size=8, hidden_size=32, num_layers=2, num_heads=2,
                                mlp_dim=64, input_shape=(32, 32, 3), weights=str(path))


def test_a_checkpoint_of_another_width_is_a_mismatch_not_a_reshape_error(tmp_path):
    """Found by using it: `keras-vit train --model ViTB16 --weights DIR` with
    a width-32 checkpoint said `cannot reshape array of size 1024 into shape
    (12,newaxis,32)`; the 12 heads of ViT-B do not split width 32."""
    folder = torch_folder(tmp_path, "timm_vit_token")
    with pytest.raises(keras_vit.weights.CheckpointMismatchError,
                       match=r"\(timm format\) does not fit model 'vit_b_16': 120 missing, "
                             "0 unexpected, 30 mis-shaped keys") as info:
        keras_vit.ViTB16(weights=str(folder), classes=3)
    assert "blocks.0.attn.qkv.weight: checkpoint (32, 2, 16) vs model (768, 12, 64)" \
        in str(info.value)
