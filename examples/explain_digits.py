"""The ViT paper's pictures for a model trained on real data: the
quickstart's digits ViT (scikit-learn's handwritten digits).

Trains the quickstart model first when `--model` does not exist (about 2
minutes on 2 cores; `--epochs` shortens it), then writes the attention
rollout of a few test digits, the mean attention distance per head, the
position-embedding similarity and the embedding-filter components as PNG
files, and prints the mean attention distance table.

    python examples/explain_digits.py [--model runs/quickstart/model.keras]
                                      [--out pictures] [--images 4]
"""

import argparse
import glob
import os

import keras
import numpy as np

from keras_vit import inspect
from keras_vit.inspect.plots import explain


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/quickstart/model.keras")
    parser.add_argument("--out", default="pictures")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()

    if not os.path.exists(args.model):
        from keras_vit.training import quickstart

        run = os.path.dirname(args.model) or "."
        quickstart(run, epochs=args.epochs, verbose=2, export_tflite=False)
    model = keras.saving.load_model(args.model)
    digits_dir = os.path.join(os.path.dirname(args.model), "digits", "test")
    paths = sorted(glob.glob(os.path.join(digits_dir, "*", "*.png")))[::90][:args.images]
    if not paths:
        raise SystemExit(f"No test digits under {digits_dir}; run keras-vit quickstart.")
    images = np.stack([keras.utils.img_to_array(keras.utils.load_img(p)) for p in paths])
    names = [f"digit{os.path.basename(os.path.dirname(p))}" for p in paths]
    written = explain(model, images, args.out, names=names)
    for kind, files in written.items():
        for path in files:
            print(f"{kind:<31} {path}")
    distance = inspect.attention_distance(model, images)
    print("mean attention distance (pixels), rows = layers, columns = heads:")
    print(np.array2string(distance, precision=1))


if __name__ == "__main__":
    main()
