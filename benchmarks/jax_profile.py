"""Where a jitted JAX step spends its device time: a `jax.profiler` trace of
a few steps, read back kernel by kernel and joined with the compiled HLO.

Used by `accelerator.py --profile DIR` (keras_vit on JAX and the official
flax block); the functions take plain files, so a trace brought back from
another machine can be read here:

    python benchmarks/jax_profile.py TRACE.json.gz HLO.txt [--steps 3] [--top 30]

Each kernel event of the device's streams carries the HLO instruction it
ran (`hlo_op`); the instruction's line in the compiled HLO gives its kind
(a library GEMM, a cuDNN attention kernel, a fusion) and the JAX name stack
(`metadata op_name`), whose `transpose(jvp(...))` marks the backward pass.
Inside a command buffer (a CUDA graph) `hlo_op` names the buffer, and the
kernel's own name, which XLA takes from its fusion, is used instead. XLA
reuses one kernel for identical fusions (the same fusion in each block), so
their calls add up under the first one's name (`calls_per_step` shows it),
and library kernels (cuBLAS, cuDNN) reached that way have no name stack:
their phase is "other".
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_instructions(hlo_text):
    """`{instruction name: its HLO line}` for every instruction."""
    lines = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            lines[match.group(1)] = match.group(2)
            # Kernels are named after their instruction, with '_' for '.'.
            lines.setdefault(match.group(1).replace(".", "_"), match.group(2))
    return lines


def kind_of(line, kernel_name=""):
    """What an instruction computes: "attention kernel" (cuDNN's fused
    attention and its helper kernels), "gemm" (cuBLAS/cuBLASLt, a Triton or
    CUTLASS GEMM fusion, a plain dot), "convolution", "copy/transpose",
    "reduction fusion" (including XLA's Triton softmax/normalization
    fusions), "elementwise fusion" or "other". Operand names are ignored."""
    own = re.sub(r"%[\w.\-]+|metadata=\{[^}]*\}", "", line).lower()
    name = kernel_name.lower()
    text = f"{own} {name}"
    if "convolution(" in own or "cudnn$conv" in own or "cudnn-conv" in name:
        return "convolution"
    if any(key in text for key in ("fmha", "sdpa", "flash", "cudnn::")):
        return "attention kernel"
    if any(key in text for key in ("cublas", "gemm", "nvjet", "xmma", "cutlass")) \
            or re.search(r"\bdot\(", own):
        return "gemm"
    if "transpose" in name or "copy" in name or re.search(r"\b(copy|transpose)\(", own):
        return "copy/transpose"
    if "kind=kinput" in own or "reduce" in text or '"kind":"__triton"' in own:
        return "reduction fusion"
    if "kind=kloop" in own or "fusion" in text:
        return "elementwise fusion"
    return "other"


def phase_of(op_name):
    """forward / backward / optimizer / other, from a JAX name stack."""
    lowered = op_name.lower()
    if "transpose(" in lowered:
        return "backward"
    if any(key in lowered for key in ("adam", "optimizer", "stateless_apply", "optax")):
        return "optimizer"
    if "jvp(" in lowered or op_name:
        return "forward"
    return "other"


def load_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as file:
        data = json.load(file)
    return data["traceEvents"] if isinstance(data, dict) else data


def summarize(events, hlo_text="", steps=1, top=30):
    """Device time per step by kind and phase, and the `top` instructions.

    Returns a dict: `device_ms_per_step` (kernel time on the device's
    streams), `by_kind`, `by_phase`, `by_kind_and_phase` (ms per step) and
    `top` (instruction, kind, phase, ms per step, calls per step, name
    stack). Without device kernels (a CPU run) `device_ms_per_step` is 0 and
    `threads` gives the host threads' busy time instead.
    """
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices = {pid for pid, name in processes.items()
               if name.startswith("/device:") and "CPU" not in name}
    instructions = hlo_instructions(hlo_text)
    per_op = collections.defaultdict(lambda: [0.0, 0, ""])
    busy = collections.Counter()
    for event in events:
        if event.get("ph") != "X":
            continue
        key = (event["pid"], event.get("tid"))
        if event["pid"] not in devices:
            busy[f"{processes.get(event['pid'], event['pid'])} / {threads.get(key, key[1])}"] \
                += event.get("dur", 0)
            continue
        if not threads.get(key, "").startswith("Stream"):
            continue
        args = event.get("args", {})
        op = args.get("hlo_op") or event["name"]
        if op not in instructions and event["name"] in instructions:
            # Inside a command buffer (a CUDA graph) the event's `hlo_op`
            # names the buffer; XLA names a fusion's kernel after the fusion.
            op = event["name"]
        elif op.startswith("command_buffer"):
            op = event["name"]
        entry = per_op[op]
        entry[0] += event.get("dur", 0) / 1e3
        entry[1] += 1
        entry[2] = entry[2] or event["name"]
    rows = []
    for op, (ms, calls, kernel) in per_op.items():
        line = instructions.get(op, "")
        match = _OP_NAME.search(line)
        op_name = match.group(1) if match else ""
        rows.append({"instruction": op, "kind": kind_of(line, kernel),
                     "phase": phase_of(op_name), "ms_per_step": ms / steps,
                     "calls_per_step": calls / steps, "kernel": kernel[:120],
                     "op_name": op_name[-160:]})
    rows.sort(key=lambda row: -row["ms_per_step"])

    def total(key):
        sums = collections.Counter()
        for row in rows:
            sums[key(row)] += row["ms_per_step"]
        return {name: round(ms, 3) for name, ms in sums.most_common()}

    report = {"device_ms_per_step": round(sum(row["ms_per_step"] for row in rows), 3),
              "by_kind": total(lambda row: row["kind"]),
              "by_phase": total(lambda row: row["phase"]),
              "by_kind_and_phase": total(lambda row: f"{row['kind']} / {row['phase']}"),
              "top": [dict(row, ms_per_step=round(row["ms_per_step"], 4)) for row in rows[:top]]}
    if not rows:
        report["threads"] = {name: round(us / 1e3 / steps, 3) for name, us in busy.most_common(8)}
    return report


def profile_step(call, compiled_text, directory, name, steps=3):
    """Traces `steps` calls of `call()` (each ending in a device sync) into
    `directory/NAME_trace/`, writes the compiled HLO to `NAME_hlo.txt`
    and the summary to `NAME_profile.json`; returns the summary."""
    import jax

    os.makedirs(directory, exist_ok=True)
    hlo_text = compiled_text()
    with open(os.path.join(directory, f"{name}_hlo.txt"), "w") as file:
        file.write(hlo_text)
    trace_dir = os.path.join(directory, f"{name}_trace")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(steps):
            call()
    paths = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                             recursive=True))
    if not paths:
        return {"error": f"no perfetto trace under {trace_dir}"}
    summary = summarize(load_trace(paths[-1]), hlo_text, steps)
    summary["trace"] = os.path.relpath(paths[-1], directory)
    with open(os.path.join(directory, f"{name}_profile.json"), "w") as file:
        json.dump(summary, file, indent=1)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="perfetto_trace.json.gz from jax.profiler.trace")
    parser.add_argument("hlo", nargs="?", help="the step's compiled HLO text")
    parser.add_argument("--steps", type=int, default=3, help="steps the trace holds")
    parser.add_argument("--top", type=int, default=30, help="instructions to list")
    args = parser.parse_args(argv)
    hlo_text = open(args.hlo).read() if args.hlo else ""
    summary = summarize(load_trace(args.trace), hlo_text, args.steps, args.top)
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
