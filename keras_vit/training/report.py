"""The classification report of a model on labelled images, what
`keras-vit evaluate` and the end of `train` show: top-1 and (more than 5
classes) top-5 accuracy, each class's precision, recall and F1 with its
counts, the confusion matrix with the class names, and the pairs of
classes mixed up most. The counts are added up batch by batch
(`Counts`), so memory grows with the classes squared, not with the
images. `format_report` is its table; `plot_confusion_matrix` its picture
(scikit-learn's `ConfusionMatrixDisplay`, matplotlib: the plots extra).

Rows of the confusion matrix are the true classes, columns the predicted
ones (scikit-learn's `confusion_matrix`). A class's recall is its
accuracy: the share of its images classified as it.

>>> counts = Counts(3)
>>> counts.add(np.array([0, 0, 1, 2]), np.array(
...     [[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.1, 0.7, 0.2], [0.0, 0.3, 0.7]]))
>>> report = counts.report(["cat", "dog", "fox"])
>>> report["accuracy"], report["confusion_matrix"]["counts"]
(0.75, [[1, 1, 0], [0, 1, 0], [0, 0, 1]])
>>> {k: v for k, v in report["per_class"][1].items() if k != "f1"}
{'name': 'dog', 'images': 1, 'correct': 1, 'predicted': 2, 'precision': 0.5, 'recall': 1.0}
"""

import numpy as np

from keras_vit import _plots
from keras_vit._console import plural

# Top-k reported beside top-1 when a model has more classes than k.
TOP_K = 5
# Largest class count whose confusion matrix the table prints (the JSON
# and the picture always hold it).
TABLE_MATRIX_CLASSES = 20
# Class pairs listed as the most mixed up.
MOST_CONFUSED = 5


class Counts:
    """The report's counts of a `classes`-class model, added batch by
    batch: the confusion matrix, the top-k hits and the summed
    cross-entropy."""

    def __init__(self, classes):
        self.classes = classes
        self.confusion = np.zeros((classes, classes), "int64")
        self.top_k = 0
        self.loss = 0.0

    def add(self, labels, outputs, losses=None):
        """Adds a batch: `labels` `(n,)` class indices, `outputs` `(n,
        classes)` logits or probabilities (the order is what counts),
        `losses` `(n,)` each image's cross-entropy (or None).

        Ties: the lower class index ranks first (NumPy's `argmax`, Keras'
        accuracy), for top-1 and top-k alike."""
        labels = np.asarray(labels, "int64")
        outputs = np.asarray(outputs)
        np.add.at(self.confusion, (labels, np.argmax(outputs, axis=1)), 1)
        if self.classes > TOP_K:
            order = np.argsort(-outputs.astype("float64"), axis=1, kind="stable")[:, :TOP_K]
            self.top_k += int((order == labels[:, None]).any(axis=1).sum())
        if losses is not None:
            self.loss += float(np.sum(np.asarray(losses, "float64")))

    def report(self, class_names, cross_entropy=False):
        """The report (`classification_report`) of the counts so far; with
        `cross_entropy`, the mean of the losses added."""
        images = int(self.confusion.sum())
        return classification_report(
            self.confusion, class_names,
            top_k=self.top_k if self.classes > TOP_K else None,
            cross_entropy=self.loss / images if cross_entropy and images else None)


def _ratio(part, whole):
    return float(part / whole) if whole else None


def classification_report(confusion, class_names, top_k=None, cross_entropy=None):
    """The report of a confusion matrix (rows: true class, columns:
    predicted class); `top_k`: the images whose class is among their
    `TOP_K` highest outputs (None: not counted, `top5_accuracy` null).

    Returns a dict: `images`, `accuracy` (top-1), `top5_accuracy`,
    `balanced_accuracy` (the mean recall of the classes with images),
    `cross_entropy` (when given), `per_class` (per class: `name`, `images`
    (its support), `correct`, `predicted`, `precision`, `recall` (its
    accuracy), `f1` (`2 TP / (2 TP + FP + FN)`); a ratio of nothing, e.g.
    the precision of a class never predicted, is None), `confusion_matrix` (`labels`, `counts`) and
    `most_confused` (`true`, `predicted`, `images`; at most 5 pairs).
    """
    confusion = np.asarray(confusion, "int64")
    names = [str(name) for name in class_names]
    if confusion.shape != (len(names), len(names)):
        raise ValueError(f"The confusion matrix is {confusion.shape}, but there are "
                         f"{len(names)} class names.")
    images = int(confusion.sum())
    support, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    correct = np.diag(confusion)
    classes = []
    for i, name in enumerate(names):
        precision, recall = _ratio(correct[i], predicted[i]), _ratio(correct[i], support[i])
        f1 = _ratio(2 * correct[i], support[i] + predicted[i])  # 2TP / (2TP + FP + FN)
        classes.append({"name": name, "images": int(support[i]), "correct": int(correct[i]),
                        "predicted": int(predicted[i]), "precision": precision,
                        "recall": recall, "f1": f1})
    recalls = [row["recall"] for row in classes if row["recall"] is not None]
    off = confusion.copy()
    np.fill_diagonal(off, 0)
    pairs = [(int(off[t, p]), t, p) for t, p in zip(*np.nonzero(off), strict=True)]
    pairs.sort(key=lambda pair: (-pair[0], pair[1], pair[2]))
    return {
        "images": images,
        "accuracy": _ratio(int(correct.sum()), images),
        "top5_accuracy": None if top_k is None else _ratio(top_k, images),
        "balanced_accuracy": float(np.mean(recalls)) if recalls else None,
        **({"cross_entropy": float(cross_entropy)} if cross_entropy is not None else {}),
        "per_class": classes,
        "confusion_matrix": {"rows": "true class", "columns": "predicted class",
                             "labels": names, "counts": confusion.tolist()},
        "most_confused": [{"true": names[t], "predicted": names[p], "images": n}
                          for n, t, p in pairs[:MOST_CONFUSED]],
    }


def _number(value, percent=False):
    if value is None:
        return "-"
    return f"{value:.2%}" if percent else f"{value:.3f}"


def format_report(report, title=None):
    """The report as a table of lines (what `keras-vit evaluate` prints):
    the accuracies, one row per class, the pairs mixed up most and, for at
    most 20 classes, the confusion matrix."""
    images = report["images"]
    correct = sum(row["correct"] for row in report["per_class"])
    lines = [title] if title else []
    lines.append(f"top-1 accuracy     {_number(report['accuracy'], True):>8}  "
                 f"({correct:,} of {plural(images, 'image')})")
    if report.get("top5_accuracy") is not None:
        lines.append(f"top-5 accuracy     {_number(report['top5_accuracy'], True):>8}")
    lines.append(f"balanced accuracy  {_number(report['balanced_accuracy'], True):>8}  "
                 "(the mean of the classes' recall)")
    if report.get("cross_entropy") is not None:
        lines.append(f"cross-entropy      {report['cross_entropy']:>8.4f}")
    width = max([5, *(len(row["name"]) for row in report["per_class"])])
    width = min(width, 40)
    lines += ["", f"{'class':<{width}}  {'images':>7}  {'correct':>7}  {'precision':>9}  "
                  f"{'recall':>7}  {'f1':>6}"]
    for row in report["per_class"]:
        lines.append(f"{row['name'][:width]:<{width}}  {row['images']:>7,}  "
                     f"{row['correct']:>7,}  {_number(row['precision']):>9}  "
                     f"{_number(row['recall']):>7}  {_number(row['f1']):>6}")
    lines.append("(recall: the share of a class's images classified as it, its accuracy; "
                 "precision: the share of the images classified as a class that are it)")
    if report["most_confused"]:
        lines += ["", "most confused (true -> predicted): " + "; ".join(
            f"{pair['true']} -> {pair['predicted']} ({plural(pair['images'], 'image')})"
            for pair in report["most_confused"])]
    lines += _matrix_lines(report["confusion_matrix"])
    return "\n".join(lines)


def _matrix_lines(matrix):
    names, counts = matrix["labels"], matrix["counts"]
    if len(names) > TABLE_MATRIX_CLASSES:
        return ["", f"confusion matrix: {len(names)} classes, in --json and the --plot "
                    "picture"]
    cell = max(3, *(len(f"{n:,}") for row in counts for n in row), len(str(len(names) - 1)))
    label = min(max(len(f"{i} {n}") for i, n in enumerate(names)), 30)
    lines = ["", "confusion matrix (rows: true class, columns: predicted class, by number):",
             " " * label + "".join(f"  {i:>{cell}}" for i in range(len(names)))]
    for i, (name, row) in enumerate(zip(names, counts, strict=True)):
        lines.append(f"{f'{i} {name}'[:label]:<{label}}"
                     + "".join(f"  {n:>{cell},}" for n in row))
    return lines


def check_plotting():
    """The ImportError of `plot_confusion_matrix` (naming the plots extra)
    before any work, when scikit-learn or matplotlib is missing."""
    for module in ("sklearn.metrics", "matplotlib"):
        _plots.require(module, "The confusion-matrix picture")


def plot_confusion_matrix(report, path, title="confusion matrix"):
    """Draws the report's confusion matrix with scikit-learn's
    `ConfusionMatrixDisplay` (the counts in each cell up to 30 classes)
    into the PNG `path`; returns `path`. Needs scikit-learn and matplotlib
    (an ImportError naming the plots extra otherwise)."""
    what = "The confusion-matrix picture"
    metrics = _plots.require("sklearn.metrics", what)
    matrix = report["confusion_matrix"]
    names, counts = matrix["labels"], np.asarray(matrix["counts"], "int64")
    side = min(max(5.0, 0.45 * len(names) + 2.5), 30.0)
    fig = _plots.figure((side, side), what)
    ax = fig.subplots()
    shown = [name if len(name) <= 24 else name[:23] + "\u2026" for name in names]
    display = metrics.ConfusionMatrixDisplay(confusion_matrix=counts, display_labels=shown)
    display.plot(ax=ax, cmap="Blues", colorbar=False, xticks_rotation="vertical",
                 include_values=len(names) <= 30, values_format=",d")
    accuracy = report["accuracy"]
    ax.set_title(f"{title}\ntop-1 {_number(accuracy, True)} of "
                 f"{plural(report['images'], 'image')}", fontsize=10)
    fig.tight_layout()
    return _plots.save(fig, path)
