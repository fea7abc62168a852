"""PNG pictures of the `keras_vit.inspect` numbers (matplotlib, an
optional extra: `pip install "keras-vision-transformer[plots]"`)."""

import os

import numpy as np

from keras_vit.inspect import analysis


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("The inspect pictures need matplotlib: pip install matplotlib "
                          "(or 'keras-vision-transformer[plots]').") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def plot_rollout(image, attention_map, path, title=None):
    """The image, and the image with the rollout map laid over it."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(6.4, 3.4))
    shown = np.clip(np.asarray(image, "float32") / 255.0, 0, 1)
    span = attention_map.max() - attention_map.min()
    heat = (attention_map - attention_map.min()) / (span if span > 0 else 1.0)
    axes[0].imshow(shown)
    axes[0].set_title("image")
    axes[1].imshow(shown)
    axes[1].imshow(heat, cmap="jet", alpha=0.5)
    axes[1].set_title(title or "attention rollout")
    for ax in axes:
        ax.axis("off")
    fig.tight_layout()
    return _save(fig, path)


def plot_attention_distance(distance, path, image_size=None):
    """Mean attention distance of every head by layer (Fig. 7, right)."""
    plt = _pyplot()
    layers, heads = distance.shape
    fig, ax = plt.subplots(figsize=(5, 4))
    for head in range(heads):
        ax.scatter(np.arange(layers), distance[:, head], s=12, label=f"head {head}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    if image_size:
        ax.set_ylim(0, max(image_size))
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return _save(fig, path)


def plot_position_similarity(similarity, path):
    """One small map per patch: its position embedding's cosine similarity
    with every other patch (Fig. 7, centre)."""
    plt = _pyplot()
    gh, gw = similarity.shape[:2]
    fig, axes = plt.subplots(gh, gw, figsize=(max(4, gw * 0.45), max(4, gh * 0.45)),
                             squeeze=False)
    for i in range(gh):
        for j in range(gw):
            axes[i][j].imshow(similarity[i, j], vmin=-1, vmax=1, cmap="viridis")
            axes[i][j].axis("off")
    fig.suptitle("position embedding similarity")
    return _save(fig, path)


def plot_embedding_filters(components, path):
    """The principal components of the patch-embedding filters as RGB
    tiles (Fig. 7, left); each tile is scaled to [0, 1]."""
    plt = _pyplot()
    n = len(components)
    cols = min(n, 7)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.9, rows * 0.9), squeeze=False)
    for k, ax in enumerate(np.ravel(axes)):
        ax.axis("off")
        if k < n:
            tile = components[k]
            span = tile.max() - tile.min()
            ax.imshow((tile - tile.min()) / (span if span > 0 else 1.0))
    fig.suptitle("embedding filters (principal components)")
    return _save(fig, path)


def explain(model, images, out, names=None, n_filters=28):
    """Writes every picture for `images` into `out`; returns `{kind: [paths]}`.

    `rollout_<name>.png` per image, `attention_distance.png`,
    `position_embedding_similarity.png` and, for pure ViTs,
    `embedding_filters.png`."""
    images = np.asarray(images, "float32")
    names = names or [f"{i:03d}" for i in range(len(images))]
    parts = analysis._Parts(model)
    # No picture of a model whose outputs are NaN or inf (weights, overflow).
    analysis.check_finite_outputs(
        analysis._run(parts.vit, analysis._images(images, parts), 16)[0],
        f"{len(images)} image{'' if len(images) == 1 else 's'} ({', '.join(names)})",
        "pictures")
    attentions = analysis.attention_weights(model, images)  # once, for both pictures
    maps = analysis.upsample_maps(
        analysis.rollout(attentions, parts.prefix, parts.grid, class_token=parts.class_token),
        parts.image_size)
    written = {"rollout": [plot_rollout(image, m, os.path.join(out, f"rollout_{name}.png"))
                           for image, m, name in zip(images, maps, names, strict=True)]}
    distance = analysis.mean_distance(attentions, parts.prefix, parts.grid, parts.pixels)
    written["attention_distance"] = [plot_attention_distance(
        distance, os.path.join(out, "attention_distance.png"), parts.image_size)]
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
