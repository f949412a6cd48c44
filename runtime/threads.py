"""How many threads TVM's kernels run on.

TVM sizes its thread pool once, on first use, from TVM_NUM_THREADS (or
OMP_NUM_THREADS), else as half the logical CPUs on x86, on the assumption that every
core has two hardware threads. On a host or VM without SMT that leaves half the cores
idle (2 vCPUs: one thread, and ResNet-18 runs 1.4x slower). tecc sets TVM_NUM_THREADS
to one thread per physical core this process may run on, before the pool exists,
unless the user has chosen a number.
"""

from __future__ import annotations

import os

THREAD_VARS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS")


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (SMT siblings count once;
    without topology information in /sys, every CPU counts)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topology + "physical_package_id") as f:
                package = f.read().strip()
            with open(topology + "core_id") as f:
                core = f.read().strip()
        except OSError:
            return max(1, len(cpus))
        cores.add((package, core))
    return max(1, len(cores))


def kernel_threads() -> int:
    """The threads kernels run on: the user's TVM_NUM_THREADS / OMP_NUM_THREADS, else
    one per physical core."""
    for var in THREAD_VARS:
        value = os.environ.get(var, "")
        if value.strip().isdigit() and int(value) > 0:
            return int(value)
    return physical_cores()


def configure_threads() -> int:
    """Fix TVM_NUM_THREADS for this process (and the processes it starts) before TVM's
    pool is created; returns the thread count."""
    threads = kernel_threads()
    os.environ["TVM_NUM_THREADS"] = str(threads)
    return threads
