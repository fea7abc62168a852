"""The API reference (`tools/api_reference.py`, pdoc) builds from the
docstrings of the public API, and a public name without a docstring stops
it, named."""

import os
import sys
import textwrap

import pytest

pytest.importorskip("pdoc")  # the `test` and `docs` extras
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import api_reference  # noqa: E402

# page -> names it documents (the anchors pdoc gives them)
PAGES = {
    "keras_vit.html": ["VisionTransformer", "MLPMixer", "ViTB16", "model_from_checkpoint",
                       "preprocess_input"],
    "keras_vit/layers.html": ["TransformerBlock", "ClassifierHead", "PatchEncoder.call"],
    "keras_vit/weights.html": ["resolve", "Checkpoint"],
    "keras_vit/data.html": ["make_dataset", "Preset.replace"],
    "keras_vit/training.html": ["train", "evaluate", "Recipe", "enable_lora"],
    "keras_vit/export.html": ["to_tflite", "to_onnx", "to_openvino", "to_saved_model",
                              "ExportReport.to_json"],
    "keras_vit/inspect.html": ["attention_rollout", "attention_distance"],
    "keras_vit/errors.html": ["CheckpointMismatchError"],
}


def test_the_reference_builds_with_every_public_name_documented(tmp_path):
    out = tmp_path / "api"
    assert api_reference.build(out) == []
    assert (out / "index.html").is_file()
    for page, names in PAGES.items():
        text = (out / page).read_text(encoding="utf-8")
        for name in names:
            assert f'id="{name}"' in text, (page, name)


def test_a_public_name_without_a_docstring_is_named_and_nothing_is_written(
        tmp_path, monkeypatch):
    (tmp_path / "apiref_demo.py").write_text(textwrap.dedent('''
        """A module."""

        __all__ = ["Base", "Bare", "Child", "bare", "documented"]


        def documented():
            """Has one."""


        def bare():
            pass


        def _private():
            pass


        class Bare(ValueError):
            pass  # ValueError's docstring is not its own


        class Base:
            """Has one."""

            def run(self):
                """Has one."""


        class Child(Base):
            """Has one."""

            def run(self):  # reads Base.run's
                pass

            @property
            def size(self):
                return 1

            def _helper(self):
                pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    missing = ["apiref_demo.Bare", "apiref_demo.Child.size", "apiref_demo.bare"]
    assert api_reference.build(tmp_path / "api", modules=("apiref_demo",)) == missing
    assert not (tmp_path / "api").exists()
