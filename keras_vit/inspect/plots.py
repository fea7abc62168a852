"""PNG pictures of the `keras_vit.inspect` numbers (matplotlib, an
optional extra: `pip install "keras-vision-transformer[plots]"`; drawn
through `keras_vit._plots`). `explain` writes them all for a few images,
each rollout picture titled with the class the model predicts and its
probability; `class_name` draws the relevance of another class
(`keras_vit.inspect.class_relevance`) instead of the rollout."""

import logging
import os

import numpy as np

from keras_vit import _plots
from keras_vit._checks import did_you_mean
from keras_vit.inspect import analysis
from keras_vit.inspect.relevance import class_relevance
from keras_vit.labels import class_labels
from keras_vit.prediction import probabilities

logger = logging.getLogger("keras_vit")
WHAT = "The inspect pictures"


def _figure(size):
    return _plots.figure(size, WHAT)


def _short(name, limit=28):
    return name if len(name) <= limit else name[:limit - 1] + "\u2026"


def plot_rollout(image, attention_map, path, title=None, image_title="image"):
    """The image (titled `image_title`, e.g. the predicted class), and the
    image with the map laid over it (titled `title`)."""
    fig = _figure((6.4, 3.4))
    axes = fig.subplots(1, 2)
    shown = np.clip(np.asarray(image, "float32") / 255.0, 0, 1)
    span = attention_map.max() - attention_map.min()
    heat = (attention_map - attention_map.min()) / (span if span > 0 else 1.0)
    axes[0].imshow(shown)
    axes[0].set_title(image_title, fontsize=9)
    axes[1].imshow(shown)
    axes[1].imshow(heat, cmap="jet", alpha=0.5)
    axes[1].set_title(title or "attention rollout", fontsize=9)
    for ax in axes:
        ax.axis("off")
    fig.tight_layout()
    return _plots.save(fig, path)


def plot_attention_distance(distance, path, image_size=None):
    """Mean attention distance of every head by layer (Fig. 7, right)."""
    layers, heads = distance.shape
    fig = _figure((5, 4))
    ax = fig.subplots()
    for head in range(heads):
        ax.scatter(np.arange(layers), distance[:, head], s=12, label=f"head {head}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    if image_size:
        ax.set_ylim(0, max(image_size))
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return _plots.save(fig, path)


def plot_position_similarity(similarity, path):
    """One small map per patch: its position embedding's cosine similarity
    with every other patch (Fig. 7, centre)."""
    gh, gw = similarity.shape[:2]
    fig = _figure((max(4, gw * 0.45), max(4, gh * 0.45)))
    axes = fig.subplots(gh, gw, squeeze=False)
    for i in range(gh):
        for j in range(gw):
            axes[i][j].imshow(similarity[i, j], vmin=-1, vmax=1, cmap="viridis")
            axes[i][j].axis("off")
    fig.suptitle("position embedding similarity")
    return _plots.save(fig, path)


def plot_embedding_filters(components, path):
    """The principal components of the patch-embedding filters as RGB
    tiles (Fig. 7, left); each tile is scaled to [0, 1]."""
    n = len(components)
    cols = min(n, 7)
    rows = -(-n // cols)
    fig = _figure((cols * 0.9, rows * 0.9))
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, ax in enumerate(np.ravel(axes)):
        ax.axis("off")
        if k < n:
            tile = components[k]
            span = tile.max() - tile.min()
            ax.imshow((tile - tile.min()) / (span if span > 0 else 1.0))
    fig.suptitle("embedding filters (principal components)")
    return _plots.save(fig, path)


def _class_index(class_name, names, model, flag):
    """The index of `class_name` (a name, or an int index) among `names`,
    or the ValueError that lists the names (and the closest ones)."""
    given = flag or "class_name"
    if isinstance(class_name, (int, np.integer)) and not isinstance(class_name, bool):
        if 0 <= class_name < len(names):
            return int(class_name)
        raise ValueError(f"{given}={class_name}; allowed: 0 to {len(names) - 1} (the "
                         f"{len(names)} classes of {model.name!r}).")
    if class_name in names:
        return names.index(class_name)
    shown = ", ".join(names[:30]) + (f", ... ({len(names):,} in all)" if len(names) > 30
                                     else "")
    named = f"{flag} {class_name!r}" if flag else f"class_name={class_name!r}"
    close = did_you_mean(class_name, names, cutoff=0.6)
    raise ValueError(f"Unknown {named}{close}; the classes of {model.name!r}: {shown}.")


def _class_names(model, count):
    """The model's class names (`class_labels`); an ImageNet label file
    that cannot be loaded (offline) leaves the pictures naming the classes
    `class_<i>`, with a warning."""
    try:
        return class_labels(model, count, what="the model's class names", unavailable=(
            "naming the classes on the pictures", "They name the classes class_<i>."))[0]
    except ValueError as error:
        if error.__cause__ is None:  # not the label file: a name that cannot be one
            raise
        logger.warning("%s", error)
        return [f"class_{i}" for i in range(count)]


def classify(model, images, class_name=None, flag=None):
    """What `explain` titles each picture with: per image,
    `{"predicted": {"class", "index", "probability"}, "explained": ...}`
    (`explained`: the same for `class_name`, a class name or index; None
    without it), the names being the model's (`keras_vit.labels.class_labels`).
    None for a model without a classification head (nothing to name;
    `class_name` is then a ValueError). `flag`: how messages name
    `class_name` (`"--class"`)."""
    images = np.asarray(images, "float32")
    try:
        probs, _ = probabilities(model, model.predict(images, verbose=0))
    except ValueError as error:  # no head (features), or one that says neither
        if class_name is not None:
            raise ValueError(f"{flag or 'class_name'} needs a classifier, but "
                             f"{str(error).rstrip('.')}.") from None
        return None
    if probs.ndim != 2:
        return None
    names = _class_names(model, probs.shape[1])
    wanted = None if class_name is None else _class_index(class_name, names, model, flag)

    def row(probs, index):
        return {"class": names[index], "index": int(index), "probability": float(probs[index])}

    return [{"predicted": row(p, int(np.argmax(p))),
             "explained": None if wanted is None else row(p, wanted)} for p in probs]


def _titles(prediction):
    """`(left title, right title)` of a rollout picture."""
    if prediction is None:
        return "image", "attention rollout"
    top = prediction["predicted"]
    left = f"predicted: {_short(top['class'])} ({top['probability']:.1%})"
    explained = prediction["explained"]
    if explained is None:
        return left, "attention rollout"
    return left, (f"relevance of {_short(explained['class'])} "
                  f"({explained['probability']:.1%})")


def explain(model, images, out, names=None, n_filters=28, class_name=None, predictions=None):
    """Writes every picture for `images` into `out`; returns `{kind: [paths]}`.

    `rollout_<name>.png` per image (titled with the class the model
    predicts and its probability, for a model with a classification
    head), `attention_distance.png`, `position_embedding_similarity.png`
    (for a model with a position embedding) and, for pure ViTs,
    `embedding_filters.png`. `class_name` (a class
    name or index): each `rollout_<name>.png` shows that class's relevance
    (`class_relevance`, the gradient-weighted rollout) instead of the
    attention rollout, which is the same for every class. `predictions`:
    `classify(model, images, class_name)` when the caller has it."""
    images = np.asarray(images, "float32")
    names = names or [f"{i:03d}" for i in range(len(images))]
    parts = analysis._Parts(model)
    # No picture of a model whose outputs are NaN or inf (weights, overflow).
    analysis.check_finite_outputs(
        analysis._run(parts.vit, analysis._images(images, parts), 16)[0],
        f"{len(images)} image{'' if len(images) == 1 else 's'} ({', '.join(names)})",
        "pictures")
    if predictions is None:
        predictions = classify(model, images, class_name)
    if class_name is not None and not (predictions and predictions[0]["explained"]):
        raise ValueError("explain: give class_name, or predictions of classify(model, "
                         "images, class_name), not predictions without an explained class.")
    attentions = analysis.attention_weights(model, images)  # once, for both pictures
    if class_name is None:
        predictions = predictions and [{**p, "explained": None} for p in predictions]
        maps = analysis.upsample_maps(
            analysis.rollout(attentions, parts.prefix, parts.grid,
                             class_token=parts.class_token), parts.image_size)
    else:
        maps = class_relevance(model, images, [p["explained"]["index"] for p in predictions])
    written = {"rollout": [
        plot_rollout(image, m, os.path.join(out, f"rollout_{name}.png"), title=right,
                     image_title=left)
        for image, m, name, (left, right) in zip(
            images, maps, names, [_titles(p) for p in predictions or [None] * len(images)],
            strict=True)]}
    distance = analysis.mean_distance(attentions, parts.prefix, parts.grid, parts.pixels)
    written["attention_distance"] = [plot_attention_distance(
        distance, os.path.join(out, "attention_distance.png"), parts.image_size)]
    if parts.encoder.position_embedding is not None:  # (RoPE, BEiT: none)
        written["position_embedding_similarity"] = [plot_position_similarity(
            analysis.position_embedding_similarity(model),
            os.path.join(out, "position_embedding_similarity.png"))]
    try:
        components, _ = analysis.embedding_filters(model, n=n_filters)
    except ValueError:  # a hybrid: no pixel filters
        pass
    else:
        written["embedding_filters"] = [plot_embedding_filters(
            components, os.path.join(out, "embedding_filters.png"))]
    return written
