"""Command-line tools that write and verify TFRecord shards in the schema of
`keras_vit.data.schema` (the TPU ImageNet convention).

    python -m tf_records build --source folder:DIR|tfds:NAME --split train \\
        --out DIR --num-shards 16 --workers 4
    python -m tf_records verify DIR [--json]
"""
