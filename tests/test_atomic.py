"""keras_vit._atomic: the one way the library writes a small file."""

import doctest
import os

import pytest

from keras_vit import _atomic


def test_the_module_example_runs():
    assert doctest.testmod(_atomic).failed == 0


def test_a_failed_write_leaves_the_target_and_no_temporary(tmp_path):
    target = tmp_path / "log.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with _atomic.replacing(target) as f:
            f.write("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["log.csv"]


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    user = tmp_path / "user.bin"
    user.write_bytes(b"keep")
    (tmp_path / "out.bin").symlink_to(user)
    _atomic.write_bytes(tmp_path / "out.bin", b"new")
    assert user.read_bytes() == b"keep"
    assert not (tmp_path / "out.bin").is_symlink()
    assert (tmp_path / "out.bin").read_bytes() == b"new"


def test_renamed_into_place_gives_a_writer_a_name_and_renames_only_on_success(tmp_path):
    target = tmp_path / "model.keras"
    with _atomic.renamed_into_place(target, ".keras") as temporary:
        assert temporary.endswith(".keras") and os.path.dirname(temporary) == str(tmp_path)
        with open(temporary, "w") as f:
            f.write("whole")
    assert target.read_text() == "whole"
    with pytest.raises(RuntimeError):
        with _atomic.renamed_into_place(target) as temporary:
            with open(temporary, "w") as f:
                f.write("half")
            raise RuntimeError("killed")
    assert target.read_text() == "whole"
    assert os.listdir(tmp_path) == ["model.keras"]


def test_publish_replaces_a_directory_whole(tmp_path):
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "old.pb").write_text("old")
    new = tmp_path / "new"
    new.mkdir()
    (new / "saved_model.pb").write_text("new")
    _atomic.publish(str(new), str(tmp_path / "served"))
    assert os.listdir(tmp_path / "served") == ["saved_model.pb"]
    assert os.listdir(tmp_path) == ["served"]


def test_temporaries_name_the_host_and_the_process(tmp_path):
    name = os.path.basename(_atomic.temporary_beside(tmp_path / "x.tflite"))
    assert name.startswith(f".x.tflite.tmp-{_atomic.host()}-{os.getpid()}-")
