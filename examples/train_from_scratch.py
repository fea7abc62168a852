"""Train a ViT from scratch on a folder of images with the `scratch` recipe.

    python examples/train_from_scratch.py --data folder:/data/my_images \\
        --image-size 64 --epochs 50 --out runs/scratch

`folder:` expects `DIR/train/<class>/*.jpg` and `DIR/test/<class>/*.jpg`
(or any `make_dataset` source). The model is a small ViT with global
average pooling (better than a class token on small data); change the
architecture with the flags below.
"""

import argparse
import json

import keras_vit
from keras_vit.training import train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--classes", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--preset", default="finetune", help="keras_vit.data preset")
    parser.add_argument("--out", default="runs/scratch")
    args = parser.parse_args(argv)
    model = keras_vit.VisionTransformer(
        patch_size=args.patch_size, hidden_size=args.hidden_size,
        num_layers=args.num_layers, num_heads=args.num_heads,
        mlp_dim=2 * args.hidden_size, classifier="gap",
        input_shape=(args.image_size, args.image_size, 3), classes=args.classes,
        classifier_activation=None)
    results = train(model, args.data, recipe="scratch", image_size=args.image_size,
                    batch_size=args.batch_size, epochs=args.epochs, preset=args.preset,
                    out=args.out, strategy="default")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
