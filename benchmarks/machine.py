"""The CPU a benchmark ran on, as every benchmark prints and records it.

This project's machine changes its CPU between sessions (an Intel Xeon with
AMX one week, an AMD EPYC the next), and a virtual machine's "model name"
can be as short as "AMD EPYC": so the record also holds the CPU's family,
model and stepping numbers and the instruction-set flags that decide which
kernels TensorFlow, PyTorch and XLA pick.

    >>> info = cpu({"model name": "AMD EPYC", "cpu family": "25", "model": "17",
    ...             "stepping": "1", "flags": "fpu avx2 avx512f avx512_bf16 sse"})
    >>> info["model"], info["cpuid"], info["flags"]
    ('AMD EPYC', 'family 25 model 17 stepping 1', ['avx2', 'avx512f', 'avx512_bf16'])
    >>> describe(info)
    'AMD EPYC (family 25 model 17 stepping 1; avx2 avx512f avx512_bf16)'
"""

import os
import platform

# The flags that change which matmul and bfloat16 kernels the frameworks run.
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
         "amx_tile", "amx_bf16", "amx_int8")


def _first_cpuinfo_block():
    """`/proc/cpuinfo`'s first processor as {key: value}; {} elsewhere."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu(fields=None):
    """The CPU as {"model", "cpuid", "cores", "flags"}: its model name, its
    family/model/stepping numbers ("" where the system does not say), the
    cores this process may use, and which of `FLAGS` it has."""
    fields = _first_cpuinfo_block() if fields is None else fields
    numbers = [f"{name} {fields[key]}" for name, key in
               (("family", "cpu family"), ("model", "model"), ("stepping", "stepping"))
               if key in fields]
    present = set((fields.get("flags") or fields.get("Features", "")).split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    return {"model": fields.get("model name") or platform.processor() or platform.machine(),
            "cpuid": " ".join(numbers), "cores": cores,
            "flags": [flag for flag in FLAGS if flag in present]}


def describe(info=None):
    """One line for a benchmark's output: model (numbers; flags)."""
    info = cpu() if info is None else info
    details = "; ".join(part for part in (info["cpuid"], " ".join(info["flags"])) if part)
    return f"{info['model']} ({details})" if details else info["model"]
