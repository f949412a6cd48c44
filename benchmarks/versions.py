"""Two versions of tecc on the end-to-end models, in one run: does a change keep the
same kernels and the same latency? Each version runs in a worker process of its own
(its checkout first on sys.path); the parent times them in interleaved rounds, so a
slow phase of the machine hits both alike.

    python benchmarks/versions.py --before REV [--after .] [--models resnet18,mlp]

REV is a git revision of this repository (checked out into benchmarks/.work/) or the
path of another checkout; --after defaults to this checkout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import host_line, write_table  # noqa: E402

# The worker: compiles each model once, then answers "time" requests with the
# per-call milliseconds of a batch of calls. It speaks JSON lines on stdin/stdout.
WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[2]))
import tecc
from tests.models import example_models
from tests.util import max_rel_error

models, compiled = example_models(batch=1), {}
out = sys.stdout
sys.stdout = sys.stderr  # compile-time prints must not reach the pipe
for line in sys.stdin:
    req = json.loads(line)
    name = req["model"]
    if req["op"] == "compile":
        model, inputs = models[name]
        start = time.perf_counter()
        cm = tecc.compile(model, inputs)
        seconds = time.perf_counter() - start
        args = [x.numpy() for x in inputs]
        with torch.no_grad():
            err = max_rel_error(cm(*inputs), model(*inputs))
        compiled[name] = (cm, args)
        kernels = [k["name"] for k in cm.plan["kernels"]]
        configs = sorted(f"{t['workload_key']} {json.dumps(t.get('config'), sort_keys=True)}"
                         for t in cm.tasks())
        reply = {"compile_s": seconds, "error": err, "kernels": kernels, "configs": configs}
    else:
        cm, args = compiled[name]
        for _ in range(3):
            cm(*args)
        deadline, times = time.perf_counter() + req["seconds"], []
        while len(times) < 2 or time.perf_counter() < deadline:
            start = time.perf_counter()
            cm(*args)
            times.append(time.perf_counter() - start)
        reply = {"ms": [t * 1e3 for t in times]}
    out.write(json.dumps(reply) + "\n")
    out.flush()
"""


class Worker:
    def __init__(self, checkout: Path, threads: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(checkout), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=checkout)

    def ask(self, **request: object) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def checkout_of(rev: str) -> Path:
    path = Path(rev)
    if path.is_dir():
        return path.resolve()
    work = ROOT / "benchmarks" / ".work" / f"rev-{rev}"
    if not work.exists():
        work.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(work), rev], cwd=ROOT,
                       check=True, capture_output=True)
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default=str(ROOT))
    parser.add_argument("--models", default="mlp,resnet18,mobilenet_v2,transformer_layer,bert")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--output", default="versions")
    args = parser.parse_args()
    sides = {"before": checkout_of(args.before), "after": checkout_of(args.after)}
    rows = []
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        workers = {side: Worker(path, args.threads) for side, path in sides.items()}
        built = {side: w.ask(op="compile", model=name) for side, w in workers.items()}
        samples: dict[str, list[float]] = {side: [] for side in workers}
        for _ in range(args.rounds):
            for side, w in workers.items():
                samples[side] += w.ask(op="time", model=name, seconds=0.3)["ms"]
        for w in workers.values():
            w.close()
        before, after = (statistics.median(samples[s]) for s in ("before", "after"))
        same_kernels = built["before"]["kernels"] == built["after"]["kernels"]
        old_configs, new_configs = (set(built[s]["configs"]) for s in ("before", "after"))
        rows.append([name, str(len(built["after"]["kernels"])),
                     "yes" if same_kernels else "no",
                     str(len(old_configs - new_configs)), str(len(new_configs - old_configs)),
                     f"{before:.3f}", f"{after:.3f}", f"{before / after:.2f}",
                     f"{built['before']['error']:.1e}", f"{built['after']['error']:.1e}"])
        print(rows[-1], flush=True)
    write_table(
        args.output, "Two versions of tecc, end to end, CPU, batch 1 (median ms)",
        ["model", "kernel calls", "same kernel calls", "configs only before",
         "configs only after", "before", "after", "before / after", "max rel err before",
         "max rel err after"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads. Untuned (fallback configs).",
         f"before: {args.before}; after: {args.after if args.after != str(ROOT) else 'this checkout'}.",
         "Each version in its own process, timed in interleaved rounds; ratios above 1 "
         "mean the later version is faster.",
         f"Command: `python benchmarks/versions.py --before {args.before}`."],
    )


if __name__ == "__main__":
    main()
