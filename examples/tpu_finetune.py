"""Fine-tune on a Cloud TPU from TFRecords on GCS.

On a TPU VM (or with TPU_NAME set), `get_strategy("auto")` connects the
TPUClusterResolver and returns a TPUStrategy; bfloat16 is the TPU's native
precision. The data must be on GCS (TPU workers cannot read local files):
write shards with

    python -m tf_records build --source folder:/data/flowers --split train \\
        --out gs://my-bucket/flowers --num-shards 64 --workers 16
    python -m tf_records build --source folder:/data/flowers --split test \\
        --out gs://my-bucket/flowers --num-shards 8

then run

    python examples/tpu_finetune.py --data tfrecord:gs://my-bucket/flowers \\
        --model ViTB16 --weights imagenet21k --steps 5000 --batch-size 512

`--batch-size` is global: a v3-8 runs 64 per core. Checkpoints and logs can
go to GCS too (`--out gs://my-bucket/runs/flowers`).
"""

import argparse
import json

from keras_vit.training import train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="tfrecord:gs://bucket/dir")
    parser.add_argument("--model", default="ViTB16")
    parser.add_argument("--weights", default="imagenet21k")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=384)
    parser.add_argument("--recipe", default="finetune")
    parser.add_argument("--strategy", default="auto", help="'tpu' to insist on a TPU")
    parser.add_argument("--out", default="runs/tpu_finetune")
    args = parser.parse_args(argv)
    results = train(args.model, args.data, weights=args.weights, recipe=args.recipe,
                    steps=args.steps, batch_size=args.batch_size,
                    image_size=args.image_size, precision="mixed_bfloat16",
                    strategy=args.strategy, out=args.out)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
