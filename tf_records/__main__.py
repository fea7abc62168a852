"""Entry point: `python -m tf_records build|verify ...`."""

import argparse
import json
import os
import sys

from tf_records.build import build, resume_advice
from tf_records.verify import verify


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(
        prog="python -m tf_records",
        description="Write and verify TFRecord shards (TPU ImageNet schema).")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the shards of one split")
    b.add_argument("--source", required=True, help="folder:DIR or tfds:NAME[:VERSION]")
    b.add_argument("--split", default="train")
    b.add_argument("--out", required=True, help="output directory (local or gs://)")
    b.add_argument("--num-shards", type=int, default=16)
    b.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="worker processes writing shards (default: the CPU count); "
                        "1 writes them in this process")
    b.add_argument("--data-dir", help="TFDS data directory")
    b.add_argument("--skip-corrupt", action="store_true",
                   help="skip and count corrupt or non-image files instead of failing")
    b.add_argument("--overwrite", action="store_true",
                   help="start over: remove the split's shards, rebuild them all")
    b.add_argument("--seed", type=int, default=0, help="shuffle seed of the folder file order")
    b.add_argument("--json", action="store_true", help="end with one JSON line")
    v = sub.add_parser("verify", help="decode every record and report")
    v.add_argument("directory")
    v.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            summary = build(args.source, args.split, args.out, args.num_shards,
                            args.workers, data_dir=args.data_dir,
                            skip_corrupt=args.skip_corrupt, overwrite=args.overwrite,
                            seed=args.seed, verbose=not args.json)
            if args.json:
                print(json.dumps(summary))
            else:
                print(f"{summary['split']}: {summary['num_examples']} examples in "
                      f"{summary['num_shards']} shards in {summary['out']} "
                      f"({summary['shards_written']} written, {summary['shards_reused']} "
                      f"reused, {summary['skipped_corrupt']} corrupt files skipped)")
                for line in summary["skipped_files"]:
                    print(f"  skipped: {line}")
            return 0
        report = verify(args.directory)
        if args.json:
            print(json.dumps(report))
        else:
            for split, row in report["splits"].items():
                print(f"{split}: {row['num_examples']} records in {row['num_shards']} shards"
                      + ("" if row["manifest"] else " (no manifest: source files not checked)"))
            for bad in report["corrupt"]:
                print(f"CORRUPT {bad['file']} record {bad['index']}: {bad['error']}")
            for problem in report["problems"]:
                print(f"PROBLEM {problem}")
            print("OK" if report["ok"] else "FAILED")
        return 0 if report["ok"] else 1
    except (ValueError, OSError) as error:
        print(f"tf_records {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command == "build":
            print(f"tf_records build: interrupted; the finished {args.split} shards in "
                  f"{args.out} are kept and no partial shard has a final name: "
                  f"{resume_advice(args.overwrite)}.", file=sys.stderr)
        else:
            print(f"tf_records {args.command}: interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
