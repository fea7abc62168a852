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
