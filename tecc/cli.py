"""The tecc command line, after tvmc: `tecc compile`, `tecc run`."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

import numpy as np


def load_model_spec(spec: str) -> tuple[Any, tuple | None]:
    """A `.pt2` file (torch.export.save), or `module:function` returning
    (model, example_inputs)."""
    if spec.endswith(".pt2"):
        return spec, None
    if ":" not in spec:
        raise SystemExit(f"tecc: model {spec!r} must be a .pt2 file or module:function")
    module_name, func_name = spec.split(":", 1)
    sys.path.insert(0, ".")
    factory = getattr(importlib.import_module(module_name), func_name)
    model, example_inputs = factory()
    return model, tuple(example_inputs)


def cmd_compile(args: argparse.Namespace) -> int:
    import tecc

    model, example_inputs = load_model_spec(args.model)
    compiled = tecc.compile(model, example_inputs, target=args.target)
    compiled.export(args.output)
    print(f"compiled {args.model} for {compiled.target}: "
          f"{len(compiled.build_result.kernels)} kernels -> {args.output}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import runtime

    package = runtime.load_package(args.package)
    specs = package.input_specs
    if args.inputs:
        with np.load(args.inputs) as data:
            missing = [s.name for s in specs if s.name not in data]
            if missing:
                raise SystemExit(f"tecc run: {args.inputs} lacks input(s) {missing}; "
                                 f"it has {sorted(data.files)}")
            arrays = [data[s.name] for s in specs]
    else:
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal(s.shape).astype(s.dtype)
                  if s.dtype.startswith("float")
                  else rng.integers(0, 2, s.shape).astype(s.dtype) for s in specs]
    flat = package.run_flat(*arrays)
    if args.print_time:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            package.run_flat(*arrays)
            times.append(time.perf_counter() - start)
        ms = np.array(times) * 1e3
        print(f"Execution time summary ({args.repeat} runs):\n"
              f" mean (ms)   median (ms)    max (ms)     min (ms)     std (ms)\n"
              f" {ms.mean():9.4f}   {np.median(ms):9.4f}   {ms.max():9.4f}   "
              f"{ms.min():9.4f}   {ms.std():9.4f}")
    if args.outputs:
        np.savez(args.outputs, **{s.name: a for s, a in zip(package.output_specs, flat,
                                                                strict=True)})
    else:
        for spec, array in zip(package.output_specs, flat, strict=True):
            print(f"{spec.name}: shape {array.shape} {array.dtype}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tecc", description="Compile PyTorch models with TVM.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a model into a deployment package")
    p.add_argument("model", help="a .pt2 file, or module:function returning (model, inputs)")
    p.add_argument("--target", default="llvm", help="llvm, llvm:<cpu>, cuda, cuda:sm_90")
    p.add_argument("-o", "--output", default="model.tar", help="package path (.tar or dir)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a deployment package")
    p.add_argument("package")
    p.add_argument("--inputs", help=".npz with one array per input name")
    p.add_argument("--outputs", help="write the outputs to this .npz")
    p.add_argument("--print-time", action="store_true")
    p.add_argument("--repeat", type=int, default=10)
    p.set_defaults(func=cmd_run)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
