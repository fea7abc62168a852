"""Fine-tune with sharpness-aware minimisation (SAM).

Chen et al. ("When Vision Transformers Outperform ResNets without
Pre-training", arXiv:2106.01548) train ViTs with SAM, rho 0.05-0.2; SAM
checkpoints load with `weights="sam"`. This script fine-tunes any named
model with the `finetune` recipe plus SAM (`--sam-rho`); each step costs two
forward/backward passes.

    python examples/sam_finetune.py --model ViTS16 --weights sam \\
        --data tfds:oxford_iiit_pet --steps 2000 --sam-rho 0.05
"""

import argparse
import json

from keras_vit.training import train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ViTB16")
    parser.add_argument("--weights", default="sam")
    parser.add_argument("--data", required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--sam-rho", type=float, default=0.05)
    parser.add_argument("--val-split", default="test")
    parser.add_argument("--out", default="runs/sam_finetune")
    args = parser.parse_args(argv)
    results = train(args.model, args.data, weights=args.weights, recipe="finetune",
                    steps=args.steps, batch_size=args.batch_size, image_size=args.image_size,
                    learning_rate=args.learning_rate, sam_rho=args.sam_rho,
                    data_dir=args.data_dir, val_split=args.val_split, out=args.out)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
