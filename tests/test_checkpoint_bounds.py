"""Checkpoint files that lie: the bounds of the checkpoint readers.

Safetensors headers that break the format's rules, sharded indexes that
point outside their folder, and `.npz` files whose declared shapes, zip
sizes or compression would make the reader allocate gigabytes: each is one
`CorruptCheckpointError` naming the file (and the tensor or member), raised
before anything big is allocated. Every file is written by hand here.
"""

import io
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import keras_vit
from keras_vit.weights import hub_layout, official, safetensors
from keras_vit.weights.official import CorruptCheckpointError, UnsupportedCheckpointError

TILE = "the safetensors format requires the tensors to tile the data section exactly"


def write_safetensors(path, header, data=b"", length=None):
    """8-byte little-endian header length + JSON header + data, by hand."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(text) if length is None else length
    path.write_bytes(struct.pack("<Q", length) + text + data)
    return path


def f32(shape, begin, end, dtype="F32"):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# --- safetensors: the format's rules ---------------------------------------------

# (header, data, exact message after "'PATH'", whether the safetensors package
# itself refuses the file too)
CORRUPT_SAFETENSORS = {
    "overlap": (
        {"a": f32([4], 0, 16), "b": f32([4], 8, 24)}, bytes(24),
        f": tensor 'b' (data_offsets [8, 24]) overlaps tensor 'a', which ends at "
        f"byte 16; {TILE}."),
    "same_offsets": (
        {"a": f32([4], 0, 16), "b": f32([4], 0, 16)}, bytes(16),
        f": tensor 'b' (data_offsets [0, 16]) overlaps tensor 'a', which ends at "
        f"byte 16; {TILE}."),
    "gap": (
        {"a": f32([4], 0, 16), "b": f32([4], 20, 36)}, bytes(36),
        f": tensor 'b' begins at byte 20, but tensor 'a' ends at byte 16: 4 bytes "
        f"belong to no tensor; {TILE}."),
    "first_not_at_zero": (
        {"a": f32([4], 4, 20)}, bytes(20),
        f": tensor 'a' begins at byte 4, but the data section begins at byte 0: 4 "
        f"bytes belong to no tensor; {TILE}."),
    "negative_offset": (
        {"a": f32([4], -16, 0)}, bytes(16),
        ": tensor 'a' has data_offsets [-16, 0]; expected [BEGIN, END] with "
        "0 <= BEGIN <= END."),
    "reversed_offsets": (
        {"a": f32([4], 16, 0)}, bytes(16),
        ": tensor 'a' has data_offsets [16, 0]; expected [BEGIN, END] with "
        "0 <= BEGIN <= END."),
    "three_offsets": (
        {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8, 16]}}, bytes(16),
        ": tensor 'a' has data_offsets [0, 8, 16]; expected [BEGIN, END] with "
        "0 <= BEGIN <= END."),
    "out_of_range": (
        {"a": f32([4], 0, 16), "b": f32([250000], 16, 1000016)}, bytes(32),
        " is truncated: tensor 'b' ends at byte 1000016 of a 32-byte data section. "
        "Download it again."),
    "trailing_bytes": (
        {"a": f32([4], 0, 16)}, bytes(20),
        f": 4 bytes follow the last tensor, 'a', at the end of the file; {TILE}."),
    "data_without_tensors": (
        {}, bytes(8),
        f": 8 bytes follow the header (no tensors) at the end of the file; {TILE}."),
    "byte_count": (
        {"a": f32([2, 3], 0, 16)}, bytes(16),
        ": tensor 'a' has data_offsets [0, 16] (16 bytes), but dtype F32 x shape "
        "[2, 3] needs 24 bytes."),
    "huge_shape": (
        {"a": f32([10**6, 10**6], 0, 16)}, bytes(16),
        ": tensor 'a' has data_offsets [0, 16] (16 bytes), but dtype F32 x shape "
        "[1000000, 1000000] needs 4,000,000,000,000 bytes."),
    "metadata_not_object": (
        {"__metadata__": ["pt"], "a": f32([4], 0, 16)}, bytes(16),
        ": __metadata__ must be a JSON object of strings, it is list."),
    "metadata_not_strings": (
        {"__metadata__": {"format": "pt", "step": 3}, "a": f32([4], 0, 16)}, bytes(16),
        ": __metadata__ must be a JSON object of strings, its value for 'step' is int."),
    "unknown_dtype": (
        {"a": f32([4], 0, 16, dtype="F33")}, bytes(16),
        ': tensor \'a\' has dtype "F33", which is not a safetensors dtype (BOOL, U8, '
        "I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, "
        "F64, C64, F4, F6_E2M3, F6_E3M2)."),
    "negative_shape": (
        {"a": f32([-4], 0, 16)}, bytes(16),
        ": tensor 'a' has shape [-4]; expected a list of non-negative integers."),
    "float_shape": (
        {"a": f32([4.0], 0, 16)}, bytes(16),
        ": tensor 'a' has shape [4.0]; expected a list of non-negative integers."),
    "bool_shape": (
        {"a": f32([True, 4], 0, 16)}, bytes(16),
        ": tensor 'a' has shape [true, 4]; expected a list of non-negative integers."),
    "string_shape": (
        {"a": f32("4", 0, 16)}, bytes(16),
        ": tensor 'a' has shape \"4\"; expected a list of non-negative integers."),
    "entry_not_object": (
        {"a": [0, 16]}, bytes(16),
        ": tensor 'a' is not an entry with dtype, shape and data_offsets (got [0, 16])."),
    "entry_without_offsets": (
        {"a": {"dtype": "F32", "shape": [4]}}, bytes(16),
        ": tensor 'a' is not an entry with dtype, shape and data_offsets (got "
        '{"dtype": "F32", "shape": [4]}).'),
    "name_twice": (
        b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, '
        b'"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', bytes(16),
        " is not a readable safetensors file (its header is not JSON: the name 'a' "
        "appears twice)."),
    "not_json": (
        b"{oops", bytes(16),
        " is not a readable safetensors file (its header is not JSON: Expecting "
        "property name enclosed in double quotes: line 1 column 2 (char 1))."),
    "not_an_object": (
        b'["a"]', b"",
        ": its safetensors header is not a JSON object (it starts with b'[\"a\"]')."),
    "nested_too_deeply": (
        b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", bytes(16),
        " is a damaged safetensors file: its header nests JSON arrays or objects too "
        "deeply to read; expected an object of tensor entries, each an object of dtype, "
        "shape and data_offsets."),
    "too_many_dimensions": (
        {"a": f32([1] * 65, 0, 4)}, bytes(4),
        ": tensor 'a' has a shape of 65 dimensions; expected at most 64."),
    "dimension_beyond_int64": (
        {"a": f32([2**63, 0], 0, 0)}, b"",
        ": tensor 'a' has shape [9223372036854775808, 0]; expected dimensions below "
        "2**63."),
    "dtype_array": (
        {"a": f32([4], 0, 16, dtype=["F32"])}, bytes(16),
        ': tensor \'a\' has dtype ["F32"], which is not a safetensors dtype (BOOL, U8, '
        "I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, "
        "F64, C64, F4, F6_E2M3, F6_E3M2)."),
    "string_offsets": (
        {"a": {"dtype": "F32", "shape": [4], "data_offsets": ["0", "16"]}}, bytes(16),
        ': tensor \'a\' has data_offsets ["0", "16"]; expected [BEGIN, END] with '
        "0 <= BEGIN <= END."),
    "nested_shape": (
        {"a": f32([[4]], 0, 16)}, bytes(16),
        ": tensor 'a' has shape [[4]]; expected a list of non-negative integers."),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_SAFETENSORS))
def test_safetensors_that_break_the_format_are_corrupt(tmp_path, case):
    header, data, message = CORRUPT_SAFETENSORS[case]
    path = write_safetensors(tmp_path / f"{case}.safetensors", header, data)
    with pytest.raises(CorruptCheckpointError, match=re.escape(f"{str(path)!r}{message}")
                       + "$"):
        safetensors.read_safetensors(path)


@pytest.mark.parametrize("case", ["overlap", "gap", "first_not_at_zero", "out_of_range",
                                  "trailing_bytes", "byte_count", "metadata_not_strings",
                                  "unknown_dtype", "negative_shape", "entry_not_object"])
def test_the_safetensors_library_refuses_them_too(tmp_path, case):
    """The crafted files really break the format: its reference reader says so."""
    header, data, _ = CORRUPT_SAFETENSORS[case]
    path = write_safetensors(tmp_path / f"{case}.safetensors", header, data)
    with pytest.raises(Exception):  # noqa: B017 (the reference library's own errors)
        load_file(str(path))


def test_header_length_beyond_the_file_or_the_format_limit(tmp_path):
    header = json.dumps({"a": f32([4], 0, 16)}).encode()
    path = write_safetensors(tmp_path / "long.safetensors", header, bytes(16), length=10_000)
    size = os.path.getsize(path)
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{str(path)!r} is truncated: its safetensors header length is 10,000 bytes, "
            f"but only {size - 8:,} follow the length field. Download it again.")):
        safetensors.read_safetensors(path)
    # the official-format sniffer (read_checkpoint) says the same, not "unknown format"
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{str(path)!r} is a truncated safetensors file: its header length is 10,000 "
            f"bytes, but only {size - 8:,} follow the length field.")):
        official.read_checkpoint(path)
    write_safetensors(path, header, bytes(16), length=200_000_000)
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{str(path)!r}: its safetensors header length is 200,000,000 bytes, more "
            "than the format's limit of 100,000,000.")):
        safetensors.read_safetensors(path)
    # a length no header has (2**40), then `{`: a damaged safetensors file
    write_safetensors(path, header, bytes(16), length=2**40)
    size = os.path.getsize(path)
    for read in (official.read_checkpoint, keras_vit.model_from_checkpoint):
        with pytest.raises(CorruptCheckpointError, match=re.escape(
                f"{str(path)!r} is a damaged safetensors file: its first 8 bytes give a "
                "header length of 1,099,511,627,776 bytes, where the format allows 2 to "
                f"100,000,000 (the file has {size:,} bytes). Download it again.")):
            read(path)
    # a header nested too deeply for the parser: still named a safetensors file
    write_safetensors(path, b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(UnsupportedCheckpointError, match=re.escape(
            f"{str(path)!r} is a safetensors file; keras_vit reads official .npz")):
        official.read_checkpoint(path)
    path.write_bytes(b"\x02\0\0")
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{str(path)!r} is not a readable safetensors file: 3 bytes, fewer than the "
            "8 of the header length.")):
        safetensors.read_safetensors(path)


@pytest.mark.parametrize("header", [b'["a"]', b'"tensors"', b"12"])
def test_a_header_that_is_json_but_not_an_object_is_a_damaged_safetensors_file(
        tmp_path, header):
    """Every reader names it a damaged safetensors file (the sniffer said
    "in no format keras_vit recognises", and that weights= reads only .npz
    and .weights.h5)."""
    path = write_safetensors(tmp_path / "list.safetensors", header, bytes(16))
    message = (f"{str(path)!r} is a damaged safetensors file: its header is not a JSON "
               f"object (it starts with {header!r}). Download it again.")
    for read in (official.read_checkpoint, keras_vit.model_from_checkpoint,
                 lambda p: keras_vit.ViTTi16(weights=p)):
        with pytest.raises(CorruptCheckpointError, match=re.escape(message) + "$"):
            read(str(path))


def test_a_valid_dtype_keras_vit_does_not_read_is_unsupported_not_corrupt(tmp_path):
    path = tmp_path / "u8.safetensors"
    save_file({"a": np.arange(4, dtype="uint8")}, str(path))
    with pytest.raises(UnsupportedCheckpointError, match=re.escape(
            f"{str(path)!r}: tensor 'a' has dtype U8; keras_vit reads F32, F16, F64, "
            "BF16, I64, I32 tensors.")) as info:
        safetensors.read_safetensors(path)
    assert not isinstance(info.value, CorruptCheckpointError)


def test_valid_files_match_the_safetensors_library(tmp_path):
    """Parity with the format's reference reader (float32 values), empty and
    scalar tensors and metadata included."""
    rng = np.random.default_rng(0)
    arrays = {
        "blocks.0.attn.qkv.weight": rng.standard_normal((6, 2)).astype("float32"),
        "half": rng.standard_normal((3, 5)).astype("float16"),
        "double": rng.standard_normal(7),
        "ints": np.arange(-3, 3, dtype="int32"),
        "longs": np.arange(4, dtype="int64").reshape(2, 2),
        "scalar": np.array(2.5, "float32"),
        "empty": np.zeros((0, 4), "float32"),
    }
    path = tmp_path / "model.safetensors"
    save_file(arrays, str(path), metadata={"format": "pt"})
    got = safetensors.read_safetensors(path)
    reference = load_file(str(path))
    assert set(got) == set(reference) == set(arrays)
    for key, value in reference.items():
        assert got[key].dtype == np.float32 and got[key].shape == value.shape, key
        np.testing.assert_array_equal(got[key], value.astype("float32"), err_msg=key)


def test_the_data_section_is_bounded(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros(64, "float32")}, str(path))
    monkeypatch.setenv("KERAS_VIT_MAX_CHECKPOINT_BYTES", "100")
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{str(path)!r} declares 256 bytes of arrays, more than the limit of 100 "
            "(KERAS_VIT_MAX_CHECKPOINT_BYTES; the largest official checkpoint, "
            "ViT-H/14, is 2.5 GB). Set KERAS_VIT_MAX_CHECKPOINT_BYTES higher to read it.")):
        safetensors.read_safetensors(path)


# --- sharded folders: the index ----------------------------------------------------


def sharded(tmp_path, weight_map, shards=None):
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    for name, arrays in (shards or {}).items():
        save_file(arrays, str(folder / name))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder, str(index)


def test_an_index_that_is_not_an_object_is_corrupt(tmp_path):
    folder, index = sharded(tmp_path, None)
    pathlib.Path(index).write_text('[{"weight_map": {}}]')
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"Index {index!r} is a JSON array; expected an object with a weight_map of "
            "tensor names to shard files.")):
        keras_vit.model_from_checkpoint(str(folder))


@pytest.mark.parametrize("weight_map,got", [
    (["a", "b"], '["a", "b"]'),
    ({"a": 1}, '{"a": 1}'),
    ({}, "{}"),
    (None, "null"),
])
def test_an_index_without_a_weight_map_of_strings_is_corrupt(tmp_path, weight_map, got):
    folder, index = sharded(tmp_path, weight_map)
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"Index {index!r} has no weight_map of tensor names to shard files (a "
            f"non-empty JSON object of strings); got {got}.")):
        hub_layout._read_folder_weights(str(folder))


@pytest.mark.parametrize("shard", ["../x.safetensors", "/etc/passwd", "sub/../../x"])
def test_an_index_naming_a_shard_outside_its_folder_is_corrupt(tmp_path, shard):
    (tmp_path / "x.safetensors").write_bytes(b"")
    folder, index = sharded(tmp_path, {"a": shard})
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"Index {index!r} maps tensor 'a' to {shard!r}, which is not a file inside "
            "its folder.")):
        keras_vit.model_from_checkpoint(str(folder))


def test_an_index_that_does_not_match_its_shards_is_corrupt(tmp_path):
    """No tensor is lost or taken from another shard silently."""
    zeros = np.zeros(2, "float32")
    folder, index = sharded(
        tmp_path, {"a": "one.safetensors", "b": "two.safetensors"},
        {"one.safetensors": {"a": zeros, "b": zeros}, "two.safetensors": {"b": zeros}})
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"Shard {str(folder / 'one.safetensors')!r} does not match {index!r}: it "
            "holds 'b', which the index maps elsewhere or not at all (1 such).")):
        hub_layout._read_folder_weights(str(folder))


# --- .npz: declared sizes against the zip directory ----------------------------------


def npy_bytes(shape, body, descr="<f4"):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue(), header.getvalue() + body


def test_a_lying_npy_header_is_refused_before_allocating(tmp_path):
    """A 231-byte file: a 3.64 TiB array declared over 4 bytes."""
    header, member = npy_bytes((10**12,), bytes(4))
    for compression in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        path = tmp_path / f"liar{compression}.npz"
        with zipfile.ZipFile(path, "w", compression=compression) as zf:
            zf.writestr("head/kernel.npy", member)
        assert os.path.getsize(path) < 400
        with pytest.raises(CorruptCheckpointError, match=re.escape(
                f"{path}: entry 'head/kernel' declares shape (1000000000000,) of float32 "
                "(4,000,000,000,000 bytes), but the zip directory says it holds 4 bytes "
                f"after its {len(header)}-byte .npy header.")):
            official.read_checkpoint(path)


def patch_central_size(path, size):
    """Writes `size` as the uncompressed size of the first member in the zip's
    central directory (what zipfile.ZipInfo.file_size reads)."""
    data = bytearray(path.read_bytes())
    at = data.rindex(b"PK\x01\x02") + 24
    data[at:at + 4] = struct.pack("<I", size)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("compression,size,holds", [
    (zipfile.ZIP_STORED, 2**31 - 1, "it stores 144"),
    (zipfile.ZIP_DEFLATED, 2**31 - 1, "its {compressed} deflate bytes can hold at most "
     "{most}"),
])
def test_a_zip_directory_that_lies_about_sizes_is_refused(tmp_path, compression, size,
                                                          holds):
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        zf.writestr("x.npy", npy_bytes((4,), bytes(16))[1])
        compressed = zf.getinfo("x.npy").compress_size
    patch_central_size(path, size)
    holds = holds.format(compressed=compressed, most=f"{1032 * compressed + 1024:,}")
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{path}: member 'x.npy' declares {size:,} bytes, but {holds}: the zip "
            "directory is wrong.")):
        official.read_checkpoint(path)


@pytest.mark.parametrize("values,declared,message", [
    # the header is read before the declared end: it disagrees with the size
    (2**20, 1_000_000, "{path}: entry 'x' declares shape (1048576,) of float32 "
     "(4,194,304 bytes), but the zip directory says it holds 999,872 bytes after its "
     "128-byte .npy header."),
    # the declared end comes within the header's read: zipfile checks the CRC there
    (1024, 1024, "{path} is not a readable .npz checkpoint: Bad CRC-32 for file 'x.npy'"),
])
def test_a_member_that_decompresses_to_more_than_declared_is_refused(
        tmp_path, values, declared, message):
    """zipfile's stream stops at the declared size (memory stays bounded by
    it); the .npy header or the CRC then disagrees."""
    path = tmp_path / "more.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", npy_bytes((values,), bytes(4 * values))[1])
    patch_central_size(path, declared)
    with pytest.raises(CorruptCheckpointError,
                       match=re.escape(message.format(path=path)) + "$"):
        official.read_checkpoint(path)


def test_the_npz_total_is_bounded(tmp_path, monkeypatch):
    path = tmp_path / "model.npz"
    np.savez(path, a=np.zeros(64, "float32"), b=np.zeros(64, "float32"))
    monkeypatch.setenv("KERAS_VIT_MAX_CHECKPOINT_BYTES", "300")
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{path} declares 768 bytes of arrays, more than the limit of 300 "
            "(KERAS_VIT_MAX_CHECKPOINT_BYTES;")):
        official.read_checkpoint(path)
    monkeypatch.setenv("KERAS_VIT_MAX_CHECKPOINT_BYTES", "768")
    assert set(official.read_checkpoint(path)) == {"a", "b"}
    for bad in ("16GiB", "-1", "0", "1e9"):
        monkeypatch.setenv("KERAS_VIT_MAX_CHECKPOINT_BYTES", bad)
        with pytest.raises(ValueError, match="^" + re.escape(
                "KERAS_VIT_MAX_CHECKPOINT_BYTES must be a positive whole number of bytes "
                f"(e.g. 17179869184), got {bad!r}.")) as info:
            official.read_checkpoint(path)
        assert not isinstance(info.value, CorruptCheckpointError)


def test_valid_npz_files_read_as_numpy_reads_them(tmp_path):
    """savez and savez_compressed, Fortran order, big-endian, empty arrays."""
    arrays = {"a/kernel": np.arange(12, dtype="float32").reshape(3, 4),
              "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
              "big": np.arange(5, dtype=">f4"), "empty": np.zeros((0, 3), "float32"),
              "ints": np.arange(3, dtype="int64")}
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, **arrays)
        got = official.read_checkpoint(path)
        with np.load(path) as reference:
            for key in arrays:
                assert got[key].dtype == reference[key].dtype, key
                np.testing.assert_array_equal(got[key], reference[key], err_msg=key)


def test_pickled_entries_are_still_refused(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, **{"head/kernel": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{path} is not a readable .npz checkpoint: Object arrays cannot be loaded "
            "when allow_pickle=False (entry 'head/kernel' holds pickled Python objects).")):
        official.read_checkpoint(path)


# --- the bz2 bomb ----------------------------------------------------------------------

# 512 MiB of float32 zeros, bzip2-compressed to under 1 KB (a few seconds to
# write; the refusal does not depend on the size: 4 GiB is refused the same way).
BOMB_ZEROS = 2**29
HEADROOM = 2**28  # the subprocess's address space beyond what its imports took


def write_bomb(path, zeros=BOMB_ZEROS):
    header, _ = npy_bytes((zeros // 4,), b"")
    chunk = bytes(1 << 24)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_BZIP2, compresslevel=9) as zf:
        with zf.open("head/kernel.npy", "w", force_zip64=True) as member:
            member.write(header)
            for _ in range(zeros // len(chunk)):
                member.write(chunk)
    return path


BOMB_SCRIPT = textwrap.dedent("""
    import re, resource, sys, time
    from keras_vit.weights import official  # imports Keras and TensorFlow
    import numpy as np

    def status(field):
        text = open("/proc/self/status").read()
        return int(re.search(field + r":\\s+(\\d+) kB", text).group(1)) * 1024

    limit = status("VmSize") + int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    start, rss = time.perf_counter(), status("VmRSS")
    try:
        official.read_checkpoint(sys.argv[1])
        print("read")
    except official.CorruptCheckpointError as error:
        print(f"{time.perf_counter() - start:.4f} s, RSS +{status('VmRSS') - rss} bytes "
              f"(peak {status('VmHWM')})", file=sys.stderr)
        print(type(error).__name__, error)
    try:  # the control: numpy's own reader, under the same bound
        np.load(sys.argv[1])["head/kernel"]
        print("control: read")
    except MemoryError:
        print("control: MemoryError")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc")
def test_a_bz2_bomb_is_refused_within_a_memory_bound(tmp_path):
    """A <1 KB .npz that decompresses to 512 MiB: refused from the zip
    directory (bzip2 decompresses a whole chunk at once, whatever its size),
    in a process whose address space is 256 MiB beyond what its imports
    (Keras, TensorFlow) took, where numpy's own reader runs out of memory."""
    path = write_bomb(tmp_path / "bomb.npz")
    assert os.path.getsize(path) < 1024
    message = (f"{path}: member 'head/kernel.npy' is compressed with bzip2; keras_vit "
               "reads .npz members stored or deflate-compressed, as numpy.savez and "
               "numpy.savez_compressed write them.")
    with pytest.raises(CorruptCheckpointError, match=re.escape(message)):
        official.read_checkpoint(path)
    run = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, str(path), str(HEADROOM)],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-2000:]
    refused, control = run.stdout.strip().splitlines()[-2:]
    assert refused.startswith("CorruptCheckpointError ") and refused.endswith(message), \
        run.stdout
    assert control == "control: MemoryError", run.stdout


def test_the_public_path_surfaces_the_same_errors(tmp_path):
    """`model_from_checkpoint` and `weights=` stop with the reader's sentence."""
    _, member = npy_bytes((10**12,), bytes(4))
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("head/kernel.npy", member)
    for load in (keras_vit.model_from_checkpoint, lambda p: keras_vit.ViTB16(weights=p)):
        with pytest.raises(CorruptCheckpointError, match=re.escape(
                f"{path}: entry 'head/kernel' declares shape (1000000000000,)")):
            load(str(path))
    header, data, message = CORRUPT_SAFETENSORS["overlap"]
    path = write_safetensors(tmp_path / "overlap.safetensors", header, data)
    for load in (keras_vit.model_from_checkpoint, lambda p: keras_vit.ViTB16(weights=p)):
        with pytest.raises(CorruptCheckpointError, match=re.escape(f"{str(path)!r}{message}")):
            load(str(path))
