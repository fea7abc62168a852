"""Every ```python block of README.md and docs/*.md runs.

Each page's blocks run in order, in one fresh namespace, in this process,
in a temporary folder that holds what they read, made only for the pages
that read it: the quickstart's outputs (`runs/quickstart/digits`, and a
small digits ViT trained here as `runs/quickstart/model.keras`),
`flowers/` (class subfolders) and `vit_repo/` (config.json +
pytorch_model.bin). Downloads cannot succeed here:
`KERAS_VIT_MIRROR` points at a closed port on 127.0.0.1 and the Hugging
Face Hub is offline, so each statement that names a download (a registered
`weights=` name, a URL, `hf://`) must stop with the library's offline
sentence; the statements after it that use its result are not run. A block
that cannot run here says why in the markdown,
`<!-- docs-test: skip (reason) -->` just before it; `SKIPPED` lists them.
Relative links and images must point at files that exist.
"""

import ast
import re
import shutil
import socket

import keras
import numpy as np
import pytest
from data_helpers import write_digit_folder
from official_fixtures import REPO_ROOT
from PIL import Image

import keras_vit
from keras_vit.errors import WeightsDownloadError
from keras_vit.labels import set_class_names

PAGES = ["README.md"] + sorted(
    str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"(?:^<!-- docs-test: skip \((?P<skip>.*?)\) -->\n)?^```python\n"
                   r"(?P<code>.*?)^```$", re.S | re.M)
# A statement that downloads: a registered weights= name, a URL, the Hub,
# or ImageNet's class names.
DOWNLOAD = re.compile(r"hf://|https?://|decode_predictions\(|"
                      r"weights\s*=\s*[\"'](?:imagenet|sam|gsam|augreg)")
# keras_vit/weights/transfer.py (official files, label files) and
# keras_vit/weights/hub_layout.py (hf://), when the server cannot be reached.
OFFLINE = "If this machine is offline or cannot reach that host"
HUB_OFFLINE = "HF_HUB_OFFLINE is set and the files are not in the Hugging Face cache"
# The statements that download, per page (each checked for the offline sentence).
DOWNLOADS = {"README.md": 7, "docs/models.md": 17}
# Blocks that cannot run in a test, with the reason their page states.
SKIPPED = [
    ("docs/data.md", "reads data that is not on this machine: a gs:// bucket, "
                     "ImageNet shards, a prepared TFDS"),
    ("docs/deploy.md", "needs mediapipe, not a test dependency; "
                       "tests/mediapipe_check runs it"),
]


def blocks(page):
    """`(first line number, code, skip reason or None)` of each python block."""
    text = (REPO_ROOT / page).read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, m["code"], m["skip"])
            for m in BLOCK.finditer(text)]


def _names(node, ctx):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def run_block(page, line, code, namespace):
    """Runs `code` statement by statement; returns how many downloads it
    checked. A statement that names a download must raise the offline
    error; the statements that read what it would have bound are not run."""
    tree = ast.parse(code)
    ast.increment_lineno(tree, line - 1)  # tracebacks point into the page
    unavailable, downloads = set(), 0
    for statement in tree.body:
        source = "\n".join(code.splitlines()[statement.lineno - line:
                                             statement.end_lineno - line + 1])
        program = compile(ast.Module([statement], []), str(REPO_ROOT / page), "exec")
        if _names(statement, ast.Load) & unavailable:
            unavailable |= _names(statement, ast.Store)
        elif DOWNLOAD.search(source):
            with pytest.raises(WeightsDownloadError) as error:
                exec(program, namespace)  # the page's own code
            hub = "hf://" in source
            message = str(error.value)
            assert (HUB_OFFLINE if hub else OFFLINE) in message, (page, statement.lineno, message)
            assert hub or "http://127.0.0.1:" in message  # the closed mirror, not the internet
            unavailable |= _names(statement, ast.Store)
            downloads += 1
        else:
            exec(program, namespace)
    return downloads


# ------------------------------------------------------------ the files

def _trained_digits_vit(images, labels):
    """A small digits ViT that knows `images` well (each top-1 logit leads
    the next by about 3 on the quickstart's test digits, more than the
    quantized exports move a logit: they pass their agreement bars)."""
    keras.utils.set_random_seed(0)
    model = keras_vit.VisionTransformer(
        patch_size=4, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64,
        classifier="gap", input_shape=(32, 32, 3), classes=10, classifier_activation=None,
        name="quickstart_vit")
    model.compile(keras.optimizers.Adam(5e-3),
                  keras.losses.CategoricalCrossentropy(from_logits=True))
    model.fit(images.astype("float32"), keras.utils.to_categorical(labels, 10),
              batch_size=32, epochs=40, verbose=0)
    set_class_names(model, [str(d) for d in range(10)])
    return model


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory, digits_folder):
    """What `keras-vit quickstart` leaves in `runs/quickstart`: `digits/`
    (conftest's `digits_folder`, read only) and a `model.keras`, here a
    small ViT trained on the test digits, which the exports verify on.
    Returns the `runs` folder."""
    quickstart = tmp_path_factory.mktemp("docs") / "runs" / "quickstart"
    quickstart.mkdir(parents=True)
    (quickstart / "digits").symlink_to(digits_folder)
    paths = sorted(digits_folder.glob("test/*/*.png"))
    images = np.stack([np.asarray(Image.open(path).convert("RGB")) for path in paths])
    labels = np.array([int(path.parent.name) for path in paths])
    _trained_digits_vit(images, labels).save(quickstart / "model.keras")
    return quickstart.parent


@pytest.fixture(scope="module")
def flowers(tmp_path_factory):
    """`flowers/`: 3 class folders (daisy, rose, tulip) of 40 images."""
    folder = tmp_path_factory.mktemp("docs") / "flowers"
    write_digit_folder(folder, per_class=40, size=32, names=("daisy", "rose", "tulip"))
    return folder


@pytest.fixture(scope="module")
def vit_repo(tmp_path_factory):
    """`vit_repo/`: a Hub folder as older repositories hold it, config.json
    and `pytorch_model.bin` (torch.save of the timm fixture's weights)."""
    torch = pytest.importorskip("torch")
    from keras_vit.weights import safetensors

    fixture = REPO_ROOT / "tests" / "fixtures" / "hub" / "timm_vit_token"
    folder = tmp_path_factory.mktemp("docs") / "vit_repo"
    folder.mkdir()
    shutil.copy(fixture / "config.json", folder)
    state = safetensors.read_safetensors(fixture / "model.safetensors")
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
               folder / "pytorch_model.bin")
    return folder


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No download can succeed: the official files' mirror is a closed port
    on 127.0.0.1, the Hub is offline with an empty cache."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends
    monkeypatch.setenv("KERAS_VIT_MIRROR", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    try:
        from huggingface_hub import constants  # read at its import: patched too
    except ImportError:
        return
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))


# ------------------------------------------------------------ the tests

@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page, offline, tmp_path, monkeypatch, request):
    runnable = [(line, code) for line, code, skip in blocks(page) if skip is None]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name, fixture in (("runs/quickstart", "quickstart_run"), ("folder:flowers", "flowers"),
                          ('"vit_repo"', "vit_repo")):
        if any(name in code for _, code in runnable):  # made only for the pages that read it
            folder = request.getfixturevalue(fixture)
            (cwd / folder.name).symlink_to(folder)
    monkeypatch.chdir(cwd)
    namespace = {"__name__": "__docs__"}
    downloads = sum(run_block(page, line, code, namespace) for line, code in runnable)
    assert downloads == DOWNLOADS.get(page, 0)


def test_skipped_blocks_are_few_and_say_why():
    skipped = [(page, skip) for page in PAGES for _, _, skip in blocks(page) if skip]
    assert skipped == SKIPPED


def test_every_page_is_reached_and_has_its_blocks():
    assert set(PAGES) == {"README.md", "docs/architecture.md", "docs/cli.md", "docs/data.md",
                          "docs/deploy.md",
                          "docs/inspect.md", "docs/models.md", "docs/performance.md",
                          "docs/training.md"}
    readme = (REPO_ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"]({page})" in readme, f"README links to {page}"
    # every ```python fence is one the test found (no block escapes the regex)
    for page in PAGES:
        text = (REPO_ROOT / page).read_text()
        assert text.count("```python\n") == len(blocks(page)), page


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(text):
    """GitHub's heading anchors of a markdown page."""
    headings = re.findall(r"^#+ (.*)$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M),
                          re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    path = REPO_ROOT / page
    text = path.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https://, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        assert resolved.exists(), f"{page}: {target}"
        if anchor:
            assert anchor in _anchors(resolved.read_text()), f"{page}: {target}"
