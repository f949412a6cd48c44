"""What a host LLVM does not know gets: an x86 host whose chip LLVM cannot name (it
says `generic`) is built for the highest x86-64 level its flags allow (`x86-64-v4`
on an AVX-512 host) instead of LLVM's generic CPU (SSE2). This runs, untuned and in one set
of interleaved rounds: torch eager, tecc for this host's own CPU name, for that level,
and as `generic`, as such a host was built for before.
python benchmarks/unknown_host.py [--models resnet18,bert] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    add_model_args,
    against_eager,
    example_model_runs,
    host_line,
    write_table,
)


@contextlib.contextmanager
def llvm_knows_no_host_cpu(as_before: bool = False) -> Iterator[str]:
    """This host as one whose chip LLVM does not know: LLVM's host CPU name reads
    `generic`, and tecc's "llvm" target is whatever it makes of that, host readings
    (cache sizes) included. `as_before`: as tecc did before it chose an x86-64 level
    (it took `generic` as it was; hiding the host's flags has tecc do so now). Yields
    the CPU name the target gets."""
    from tecc.runtime import cpu
    from tvm.target import codegen

    import tecc.target as target_module

    real_name, real_flags = codegen.llvm_get_system_cpu, cpu.host_cpuinfo_flags

    def forget() -> None:
        target_module.host_llvm_cpu.cache_clear()
        target_module._INFO.clear()  # facts of the host target, by its JSON

    codegen.llvm_get_system_cpu = lambda: "generic"
    if as_before:
        cpu.host_cpuinfo_flags = lambda: None
    forget()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield target_module.host_llvm_cpu()
    finally:
        codegen.llvm_get_system_cpu, cpu.host_cpuinfo_flags = real_name, real_flags
        forget()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_model_args(parser, "unknown_host")
    args = parser.parse_args()

    import tecc
    from tecc.target import target_info

    host = target_info("llvm").cpu
    with llvm_knows_no_host_cpu() as level:  # the name such a host's target gets
        pass
    rows = []
    for name, model, inputs in example_model_runs(args):
        builds = {host: tecc.compile(model, inputs)}
        with llvm_knows_no_host_cpu():
            builds[level] = tecc.compile(model, inputs)
        with llvm_knows_no_host_cpu(as_before=True):
            builds["generic"] = tecc.compile(model, inputs)
        ms, err = against_eager(model, inputs, builds, rounds=9)
        print(name, {k: round(v, 3) for k, v in ms.items()}, flush=True)
        rows.append([name, f"{ms['eager']:.3f}", f"{ms[host]:.3f}", f"{ms[level]:.3f}",
                     f"{ms['generic']:.3f}", f"{ms['generic'] / ms[level]:.2f}x",
                     f"{ms[host] / ms[level]:.2f}x", f"{ms['eager'] / ms[level]:.2f}x",
                     f"{err:.1e}"])
    notes = [f"Host: {host_line()}; torch and tecc on {args.threads} threads, batch 1, "
             "untuned (fallback configs), median ms of 9 interleaved rounds.",
             f"`{level}`: what tecc builds for this host as one whose chip LLVM does not "
             "know (LLVM's host name made to read `generic`): the highest x86-64 level its "
             "/proc/cpuinfo flags allow, with this host's cache sizes; `generic`: what such "
             f"a host got before (LLVM's name taken as it was: SSE2); `{host}`: this host's own CPU name, as LLVM knows it.",
             f"Command: `python benchmarks/unknown_host.py --models {args.models}`."]
    write_table(args.output, "An x86 host LLVM does not know: its x86-64 level against LLVM's generic CPU",
                ["model", "torch eager", f"tecc {host}", f"tecc {level}", "tecc generic",
                 f"{level} vs generic", f"{level} vs {host}",
                 f"{level} vs eager", "max rel err"], rows, notes)


if __name__ == "__main__":
    main()
