"""Fine-tune an ImageNet-21k ViT-B/16 on CIFAR-10 with the official recipe.

The official result (ViT paper, Table 9 / vit_jax README): ViT-B/16 from
ImageNet-21k reaches 98.6-99.0% on CIFAR-10 at 384 px with SGD (momentum
0.9, lr 0.03, 500 warmup steps, cosine, global-norm clip 1, batch 512,
500-10,000 steps). This script runs exactly that `finetune` recipe.

Needs the official checkpoint (downloaded on first use) and CIFAR-10 as a
TFDS dataset (`tfds build cifar10`, or pass --data-dir). On a GPU/TPU:

    python examples/finetune_cifar10.py --steps 10000 --batch-size 512 \\
        --precision mixed_bfloat16 --out runs/cifar10

Expected: test accuracy 0.986-0.990 (official), printed as the last JSON line.
"""

import argparse
import json

from keras_vit.training import train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ViTB16")
    parser.add_argument("--weights", default="imagenet21k")
    parser.add_argument("--data", default="tfds:cifar10")
    parser.add_argument("--data-dir", help="TFDS data directory")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=384)
    parser.add_argument("--learning-rate", type=float, default=0.03)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--out", default="runs/finetune_cifar10")
    args = parser.parse_args(argv)
    results = train(args.model, args.data, weights=args.weights, recipe="finetune",
                    steps=args.steps, batch_size=args.batch_size, image_size=args.image_size,
                    learning_rate=args.learning_rate, precision=args.precision,
                    strategy=args.strategy, data_dir=args.data_dir, out=args.out)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
