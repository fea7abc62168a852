"""The checkpoint registry against the official listings, `weights="imagenet"`,
family architectures (GSAM ViTs) and `keras-vit download`.

Downloads go to a loopback HTTP server (`KERAS_VIT_MIRROR`), never the
network.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import keras_vit
from conftest import run_cli, run_cli_process
from keras_vit.variants import ALL_VARIANTS, MIXER_VARIANTS, VIT_VARIANTS
from keras_vit.weights import official, registry
from official_fixtures import REPO_ROOT, Fixture
from test_checkpoints import make_official_npz
from test_download import Server, cache_dir

# The saved output of the official `vit_jax.ipynb` cell "# Shows all available
# pre-trained models." (google-research/vision_transformer @ c6de1e5):
# `gsutil ls -lh gs://vit_models/imagenet*`, `gs://vit_models/sam`,
# `gs://mixer_models/*`.
OFFICIAL_LISTING = {
    "vit_models/imagenet21k+imagenet2012": [
        "R50+ViT-B_16", "ViT-B_16-224", "ViT-B_16", "ViT-B_32", "ViT-B_8",
        "ViT-L_16-224", "ViT-L_16", "ViT-L_32"],
    "vit_models/imagenet21k": [
        "R26+ViT-B_32", "R50+ViT-B_16", "R50+ViT-L_32", "ViT-B_16", "ViT-B_32",
        "ViT-B_8", "ViT-H_14", "ViT-L_16", "ViT-L_32"],
    "vit_models/sam": ["ViT-B_16", "ViT-B_32", "ViT-L_16", "ViT-L_32", "ViT-S_16"],
    "mixer_models/gsam": ["Mixer-B_16", "Mixer-B_32", "Mixer-S_16", "Mixer-S_32",
                          "Mixer-S_8"],
    "mixer_models/imagenet1k": ["Mixer-B_16", "Mixer-L_16"],
    "mixer_models/imagenet21k": ["Mixer-B_16", "Mixer-L_16"],
    "mixer_models/sam": ["Mixer-B_16", "Mixer-B_32"],
}
# `gs://vit_models/gsam` is not in that listing: the official configs
# `ViT-{S_16,B_16,S_32,B_32}-gap-norep` ("compatible with GSAM checkpoints")
# and the same-basename convention give these four (see registry.py).
GSAM_VITS = ["ViT-S_16", "ViT-S_32", "ViT-B_16", "ViT-B_32"]
# The recommended AugReg pairs: README table (9 models) and, for B/8, the
# official vit_jax_augreg.ipynb recommended-checkpoint table.
AUGREG_B8 = "B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0"
AUGREG_B8_FT = AUGREG_B8 + "--imagenet2012-steps_20k-lr_0.03-res_224"

# Official `vit_jax/models_test.py` MODEL_SIZES (1000 classes, 224).
R26_B32_PARAMS = 101_383_976


def registered_files():
    """{folder: [stems]} of every registered family but AugReg."""
    files = {}
    for table, variants in ((registry.VIT_FAMILIES, VIT_VARIANTS),
                            (registry.MIXER_FAMILIES, MIXER_VARIANTS)):
        for family in table.values():
            if family.folder == "vit_models/augreg":
                continue
            for key in family.files:
                url = registry.lookup(family.name, variants[key], key).url
                stem = url.rsplit("/", 1)[1].replace("%2B", "+")[:-len(".npz")]
                files.setdefault(family.folder, []).append(stem)
    return files


def test_registry_is_exactly_the_official_listing():
    files = registered_files()
    assert sorted(files.pop("vit_models/gsam")) == sorted(GSAM_VITS)
    assert {k: sorted(v) for k, v in files.items()} == {
        k: sorted(v) for k, v in OFFICIAL_LISTING.items()}


def test_every_family_cites_its_evidence():
    for family in [*registry.VIT_FAMILIES.values(), *registry.MIXER_FAMILIES.values()]:
        assert family.evidence.startswith("official"), family.name


def test_augreg_b8_recommended_pair():
    variant = VIT_VARIANTS["B/8"]
    assert registry.lookup("augreg", variant, "B/8").url.endswith(f"/{AUGREG_B8}.npz")
    ft = registry.VIT_FAMILIES["augreg+imagenet2012"]
    assert registry.lookup(ft.name, variant, "B/8").url.endswith(f"/{AUGREG_B8_FT}.npz")
    assert ft.resolution_for("B/8") == 224 and ft.resolution_for("B/16") == 384


@pytest.mark.parametrize("function", sorted(ALL_VARIANTS))
def test_imagenet_choice_is_a_registered_1k_classifier(function):
    variant = ALL_VARIANTS[function]
    one_k = {n for n, f in registry.families_for(variant).items() if f.classes == 1000}
    choice = registry.imagenet_choice(variant)
    if not one_k:
        assert choice is None
        assert "imagenet" not in registry.available_weights(variant)
        return
    assert choice.weights in one_k and choice.evidence
    assert registry.available_weights(variant)[0] == "imagenet"
    alias = registry.lookup("imagenet", variant, variant.official_name)
    family = registry.lookup(choice.weights, variant, variant.official_name)
    assert (alias.url, alias.filename) == (family.url, family.filename)  # one cache file


def test_imagenet_choices_follow_the_official_numbers():
    vit = registry.IMAGENET_CHOICES["vit"]
    # AugReg fine-tunes (README: B/16 85.49%) beat imagenet21k+imagenet2012
    # (README replication: 84.53%) wherever both exist.
    assert vit["B/16"].weights == "augreg+imagenet2012" and vit["B/16"].top1 == 85.49
    assert vit["L/32"].weights == "imagenet21k+imagenet2012"  # no AugReg L/32
    assert vit["B/8"].weights == "augreg+imagenet2012" and vit["B/8"].top1 == 85.58
    assert registry.IMAGENET_CHOICES["mixer"]["L/16"].weights == "imagenet1k"
    assert registry.lookup("imagenet", MIXER_VARIANTS["S/8"], "x").url.endswith(
        "/mixer_models/gsam/Mixer-S_8.npz")
    assert "'imagenet' is 'augreg+imagenet2012' (384px, top-1 85.49%)" in " ".join(
        keras_vit.ViTB16.__doc__.split()).replace('`weights="imagenet"`', "'imagenet'")


@pytest.mark.parametrize("function", ["ViTH14", "R26ViTB32"])
def test_imagenet_for_a_variant_without_1k_classifier(function):
    name = ALL_VARIANTS[function].official_name
    with pytest.raises(ValueError, match=re.escape(
            f"{name} has no official ImageNet-1k classifier, so weights='imagenet' is "
            "not available (its checkpoints: 'imagenet21k' (21,843 classes)). Valid: "
            "None, 'imagenet21k', or the path to an official .npz or a Keras "
            ".weights.h5 file.")):
        getattr(keras_vit, function)(weights="imagenet")


def mixer_params(patch, hidden, blocks, tokens_mlp, channels_mlp, image=224, classes=1000):
    """Parameter count of the official `MlpBlock`/`MixerBlock` Mixer."""
    tokens = (image // patch) ** 2
    block = (2 * 2 * hidden                                         # two LayerNorms
             + tokens * tokens_mlp + tokens_mlp + tokens_mlp * tokens + tokens
             + hidden * channels_mlp + channels_mlp + channels_mlp * hidden + hidden)
    return (patch * patch * 3 * hidden + hidden + blocks * block + 2 * hidden
            + hidden * classes + classes)


def test_new_variants_have_the_official_parameter_counts():
    # The formula reproduces the official MODEL_SIZES of the listed Mixers ...
    assert mixer_params(16, 768, 12, 384, 3072) == 59_880_472
    assert mixer_params(32, 768, 12, 384, 3072) == 60_293_428
    # ... and gives Mixer-S/8 (not in the official models.py): 20,646,504
    # float32 parameters are 78.76 MiB, the listing's "78.79 MiB
    # gs://mixer_models/gsam/Mixer-S_8.npz" less the archive's overhead.
    expected = mixer_params(8, 512, 8, 256, 2048)
    assert expected == 20_646_504
    assert keras_vit.MixerS8().count_params() == expected
    model = keras_vit.R26ViTB32()
    assert model.count_params() == R26_B32_PARAMS
    assert model.input_shape == (None, 224, 224, 3) and model.output_shape == (None, 1000)


# ------------------------------------------------------- family architecture

@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "www")
    yield s
    s.close()


@pytest.fixture(scope="module")
def gsam_s32(tmp_path_factory):
    """A ViT-S/32 file in the GSAM layout: gap classifier (no `cls`), no
    pre_logits, 1000 classes (official `ViT-S_32-gap-norep` config)."""
    architecture = keras_vit.VisionTransformer(
        32, 384, 12, 6, 1536, classifier="gap", representation_size=None, classes=1000)
    assert architecture.count_params() == 22_878_184  # official MODEL_SIZES
    return make_official_npz(official.official_manifest(architecture), 5,
                             tmp_path_factory.mktemp("gsam"))


def test_gsam_builds_the_gap_model_its_file_needs(server, monkeypatch, gsam_s32):
    arrays = np.load(gsam_s32)
    assert "cls" not in arrays and "pre_logits/kernel" not in arrays
    server.put("vit_models/gsam/ViT-S_32.npz", gsam_s32)
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    model = keras_vit.ViTS32(weights="gsam")
    assert server.requests == ["/vit_models/gsam/ViT-S_32.npz"]
    assert model.output_shape == (None, 1000)
    assert model.get_layer("patch_encoder").use_class_token is False
    np.testing.assert_array_equal(model.get_layer("head").bias.numpy(), arrays["head/bias"])
    # passing the family's own settings is fine; the cache serves it
    keras_vit.ViTS32(weights="gsam", classifier="gap", representation_size=None)
    assert len(server.requests) == 1


def test_gsam_with_a_conflicting_classifier_is_a_clear_error(server, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    with pytest.raises(ValueError, match=re.escape(
            "weights='gsam' loads ViT-B_16 files of the 'gsam' family, built with "
            "classifier='gap', representation_size=None; got classifier='token'. Leave "
            "`classifier` out (or pass classifier='gap'), or use other weights.")):
        keras_vit.ViTB16(weights="gsam", classifier="token")
    assert server.requests == []
    assert "`weights='gsam'` builds classifier='gap'" in keras_vit.ViTB16.__doc__


# ------------------------------------------------------- keras-vit download

def cli(*argv, env=None):
    """`keras-vit ARGV` as the console script starts it (lazy: no TensorFlow
    for `download`), in a fresh process."""
    return run_cli_process(*argv, launcher="keras_vit_cli", env=env)


def test_download_print_url_downloads_nothing_and_imports_no_tensorflow(server):
    env = {"KERAS_VIT_MIRROR": server.url, "KERAS_HOME": os.environ["KERAS_HOME"]}
    code = textwrap.dedent("""
        import io, sys
        import keras_vit_cli
        from keras_vit import cli
        out = io.StringIO()
        assert cli.main(["download", "imagenet", "--model", "ViTB16", "--print-url",
                         "--json"], out=out) == 0
        print(out.getvalue().strip())
        print("tensorflow" in sys.modules, "keras" in sys.modules)
    """)
    environ = dict(os.environ, **env, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=environ, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    record, modules = result.stdout.strip().splitlines()
    assert modules == "False False"
    stem = ("B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
            "--imagenet2012-steps_20k-lr_0.03-res_384")
    assert json.loads(record) == {
        "weights": "imagenet", "model": "ViTB16",
        "url": f"{server.url}/vit_models/augreg/{stem}.npz",
        "path": str(cache_dir() / f"vit_models--augreg--{stem}.npz"),
        "cached": False,
    }
    assert server.requests == []
    assert not cache_dir().exists() or not list(cache_dir().iterdir())

    text = cli("download", "imagenet21k", "--model", "R26ViTB32", "--print-url", env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"URL:     {server.url}/vit_models/imagenet21k/R26%2BViT-B_32.npz"
    assert lines[1] == f"Copy to: {cache_dir() / 'vit_models--imagenet21k--R26+ViT-B_32.npz'}"
    assert server.requests == []


def test_download_fills_the_cache_that_weights_then_uses(server, monkeypatch):
    """(In this process: that `download` starts without TensorFlow is the
    test above; this one reads the .npz, which loads TensorFlow.)"""
    fixture = Fixture("mixer_tiny")  # any official .npz: download checks the format
    # (a file with no official size: the listed ones must have theirs)
    stem = registry._AUGREG_I1K["B/8"]
    server.put(f"vit_models/augreg/{stem}.npz", fixture.checkpoint)
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    first = run_cli("download", "imagenet", "--model", "ViTB8", "--json")
    assert first.code == 0, first.err
    record = json.loads(first.out)
    path = cache_dir() / f"vit_models--augreg--{stem}.npz"
    assert record["path"] == str(path) and record["cached"] is False
    assert record["bytes"] == path.stat().st_size == os.path.getsize(fixture.checkpoint)
    assert record["downloaded_from"] == f"{server.url}/vit_models/augreg/{stem}.npz"
    assert server.requests == [f"/vit_models/augreg/{stem}.npz"]
    again = run_cli("download", "augreg+imagenet2012", "--model", "ViT-B_8")
    assert again.code == 0, again.err
    assert again.out.startswith(f"Already cached: {path} (")
    assert len(server.requests) == 1


@pytest.mark.parametrize("argv,message", [
    (["imagenet21k"], "keras-vit: error: The file of weights 'imagenet21k' depends on the "
                      "model: pass --model, one of ViTB8, ViTB16,"),
    (["nope"], "keras-vit: error: Unknown weights 'nope'; registered names: augreg,"),
    (["sam", "--model", "ViTX"], "keras-vit: error: Unknown --model 'ViTX'; named models: "
                                 "ViTTi16,"),
    (["sam", "--model", "MixerS16"], "keras-vit: error: Unknown weights 'sam' for "
                                     "Mixer-S_16. Valid: None, 'imagenet', 'gsam',"),
    (["imagenet", "--model", "ViTH14"], "keras-vit: error: ViT-H_14 has no official "
                                        "ImageNet-1k classifier"),
    (["augreg:Q_16-x"], "keras-vit: error: AugReg file 'Q_16-x' starts with no model's "
                        "prefix; AugReg prefixes: Ti_16-,"),
])
def test_download_errors_are_one_line(argv, message):
    result = cli("download", *argv, "--print-url")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(message), result.stderr


def test_readme_tables_are_the_registry():
    readme = (REPO_ROOT / "docs" / "models.md").read_text()  # the tables' page
    for marker, render in (("weights", registry.weights_markdown),
                           ("imagenet", registry.imagenet_markdown)):
        block = readme.split(f"<!-- registry:{marker} -->\n")[1].split(
            f"\n<!-- /registry:{marker} -->")[0]
        assert block == render(), f"README block {marker!r}: paste registry.{render.__name__}()"
    for function in ALL_VARIANTS:  # the Models table has every named model
        assert f"| `{function}` | " in readme


def test_registry_docstring_example():
    import doctest

    assert doctest.testmod(registry).failed == 0
