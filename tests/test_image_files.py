"""keras_vit._image_files: the one list of image extensions, shared by the
folder data source and `keras-vit predict` / `explain`."""

import re

import pytest

from keras_vit import _image_files


def test_directories_give_their_image_files_recursively_and_sorted(tmp_path):
    for name in ("b/2.PNG", "b/1.jpg", "a.jpeg", "notes.txt", "c/deep/3.gif"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    single = tmp_path / "other.dat"
    single.write_bytes(b"")
    assert _image_files.image_paths([str(tmp_path), str(single)]) == [
        str(tmp_path / "a.jpeg"), str(tmp_path / "b/1.jpg"), str(tmp_path / "b/2.PNG"),
        str(tmp_path / "c/deep/3.gif"), str(single)]  # a file is taken as given


def test_a_missing_path_or_a_folder_without_images_is_one_sentence(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            f"Image not found: {str(tmp_path / 'x.png')!r}.")):
        _image_files.image_paths([str(tmp_path / "x.png")])
    (tmp_path / "notes.txt").write_text("no pictures here")
    with pytest.raises(ValueError, match=re.escape(
            f"No image files (.jpg, .jpeg, .png, .bmp, .gif) under {str(tmp_path)!r}.")):
        _image_files.image_paths([str(tmp_path)])


def test_the_data_source_uses_the_same_list():
    from keras_vit.data import sources

    assert sources.IMAGE_EXTENSIONS is _image_files.IMAGE_EXTENSIONS
    assert _image_files.is_image_name("x.BMP") and not _image_files.is_image_name("x.webp")

