"""Run a plan (runtime/plan.md) over a built kernel library.

Runtime only: imports numpy, the stdlib and TVM's runtime API; never torch nor the
compiler, so a deployment package runs where neither is installed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _tvm

PLAN_VERSION = 1

# TVM kernels take a tensor only when its data pointer is 64-byte aligned and its
# byte_offset is 0 (tvm.runtime.from_dlpack checks the first, the generated code
# the second), so storages start 64-byte aligned and tensor offsets are multiples of 64.
ALIGNMENT = 64


class PlanError(ValueError):
    """The plan, the library or the params do not fit together."""


class TensorSpec(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    def describe(self) -> str:
        return f"{self.shape} {self.dtype}"


def unflatten_outputs(structure: Mapping[str, Any], flat: Sequence[Any]) -> Any:
    """Rebuild the model's output from the flat outputs list (plan.md output_structure)."""
    kind = structure.get("kind")
    if kind == "tensor":
        index = structure.get("index")
        if not isinstance(index, int) or not 0 <= index < len(flat):
            raise PlanError(
                f"output_structure refers to output #{index!r}, but the plan has "
                f"{len(flat)} output(s)"
            )
        return flat[index]
    if kind in ("tuple", "list"):
        items = [unflatten_outputs(item, flat) for item in _items(structure)]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        keys = structure.get("keys")
        items = _items(structure)
        if not isinstance(keys, list) or len(keys) != len(items):
            raise PlanError(
                f"output_structure dict needs as many 'keys' as 'items', got {structure!r}"
            )
        return {key: unflatten_outputs(item, flat) for key, item in zip(keys, items, strict=True)}
    if kind == "none":
        return None
    raise PlanError(
        f"unknown output_structure kind {kind!r} (expected tensor, tuple, list, dict or none)"
    )


def _items(structure: Mapping[str, Any]) -> list[Any]:
    items = structure.get("items")
    if not isinstance(items, list):
        raise PlanError(f"output_structure {structure.get('kind')!r} needs a list 'items'")
    return items


def _default_structure(n_outputs: int) -> dict[str, Any]:
    # A plan without output_structure: one output is returned bare, several as a tuple.
    if n_outputs == 1:
        return {"kind": "tensor", "index": 0}
    return {"kind": "tuple", "items": [{"kind": "tensor", "index": i} for i in range(n_outputs)]}


def _aligned_buffer(nbytes: int) -> np.ndarray:
    # Over-allocate and slice so the first byte sits on an ALIGNMENT boundary.
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start : start + nbytes]


def _nbytes(storage: Any) -> int:
    return int(np.prod(storage.shape, dtype=np.int64)) * np.dtype(storage.dtype).itemsize


def _numpy_dtype(dtype: str, where: str) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise PlanError(f"{where}: dtype {dtype!r} is not a numpy dtype") from exc


def _shape_of(spec: Any, where: str) -> tuple[int, ...]:
    if not isinstance(spec, (list, tuple)) or not all(
        isinstance(d, int) and d >= 0 for d in spec
    ):
        raise PlanError(f"{where}: shape must be a list of non-negative ints, got {spec!r}")
    return tuple(spec)


def index_checks(plan: Mapping[str, Any], specs: Sequence[TensorSpec]
                 ) -> list[tuple[int, str, int]]:
    """(input position, name, table rows) of the plan's "index_checks": inputs that
    index a table (embedding, index_select)."""
    position = {s.name: i for i, s in enumerate(specs)}
    checks = []
    for check in plan.get("index_checks", ()):
        if check.get("input") not in position:
            raise PlanError(f"index check of input {check.get('input')!r}: no such input")
        checks.append((position[check["input"]], check["input"], int(check["size"])))
    return checks


def check_indices(checks: Sequence[tuple[int, str, int]], arrays: Sequence[Any]) -> None:
    """IndexError, as torch raises it, for an input that indexes a table with a value
    outside [0, rows); inputs that are no numpy arrays (on a GPU) are not checked."""
    for i, name, size in checks:
        a = arrays[i]
        if not isinstance(a, np.ndarray) or not a.size:
            continue
        low, high = a.min(), a.max()
        if low < 0 or high >= size:
            bad = int(low) if low < 0 else int(high)
            raise IndexError(f"input {name!r}: index {bad} is out of range for a "
                             f"table of {size} rows (valid: 0 to {size - 1})")


class Executor:
    """Runs a plan: storages allocated once, params bound once, kernels called in order.

    module: a loaded TVM module (or anything whose ``module[name]`` returns a callable)
    plan: the plan dict (runtime/plan.md); params: name -> numpy array.
    """

    def __init__(
        self,
        module: Any,
        plan: Mapping[str, Any],
        params: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.plan = plan
        self._setup_device()
        version = plan.get("version")
        if version != PLAN_VERSION:
            raise PlanError(
                f"plan version {version!r} is not supported by this runtime "
                f"(it reads version {PLAN_VERSION}); recompile the model with a matching tecc"
            )
        for key in ("storages", "tensors", "inputs", "outputs", "kernels"):
            if not isinstance(plan.get(key), list):
                raise PlanError(f"plan is missing the list {key!r}")

        # Storages: one aligned byte buffer each, allocated once.
        self._storages: dict[int, np.ndarray] = {}
        for s in plan["storages"]:
            sid, nbytes = s.get("id"), s.get("nbytes")
            if not isinstance(nbytes, int) or nbytes < 0:
                raise PlanError(f"storage {sid!r}: nbytes must be a non-negative int")
            if sid in self._storages:
                raise PlanError(f"storage id {sid!r} appears twice in the plan")
            self._storages[sid] = self._allocate(nbytes)

        # Tensors: numpy views into the storages, and their TVM wrappers made once.
        self._views: dict[int, np.ndarray] = {}
        self._tvm: dict[int, Any] = {}
        for t in plan["tensors"]:
            tid = t.get("id")
            where = f"tensor {tid!r}"
            if tid in self._views:
                raise PlanError(f"tensor id {tid!r} appears twice in the plan")
            sid, offset = t.get("storage"), t.get("offset", 0)
            if sid not in self._storages:
                raise PlanError(f"{where}: storage {sid!r} does not exist in the plan")
            shape = _shape_of(t.get("shape"), where)
            dtype = _numpy_dtype(t.get("dtype"), where)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            storage = self._storages[sid]
            if not isinstance(offset, int) or offset < 0 or offset % ALIGNMENT:
                raise PlanError(
                    f"{where}: offset {offset!r} in storage {sid} is not a multiple of "
                    f"{ALIGNMENT} bytes; TVM kernels need {ALIGNMENT}-byte aligned tensors "
                    f"(the memory planner must align offsets)"
                )
            if offset + nbytes > _nbytes(storage):
                raise PlanError(
                    f"{where}: shape {shape} {dtype} needs bytes [{offset}, {offset + nbytes}) "
                    f"but storage {sid} has only {_nbytes(storage)} bytes"
                )
            self._views[tid], self._tvm[tid] = self._view(storage, offset, nbytes, shape, dtype)

        self.input_specs: list[TensorSpec] = [
            self._spec(entry, "input") for entry in plan["inputs"]
        ]
        self.output_specs: list[TensorSpec] = [
            self._spec(entry, "output") for entry in plan["outputs"]
        ]
        self._index_checks = index_checks(plan, self.input_specs)
        self._in_views = [self._views[e["tensor"]] for e in plan["inputs"]]
        self._out_views = [self._views[e["tensor"]] for e in plan["outputs"]]

        self._bind_params(plan.get("params", []), params or {})

        # Kernels: look each function up once and pre-build its argument tuple.
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        funcs: dict[str, Callable[..., Any]] = {}
        for i, k in enumerate(plan["kernels"]):
            name, args = k.get("name"), k.get("args")
            if not isinstance(args, list):
                raise PlanError(f"kernel #{i} {name!r}: 'args' must be a list of tensor ids")
            for a in args:
                if a not in self._tvm:
                    raise PlanError(f"kernel #{i} {name!r}: argument tensor {a!r} does not exist")
            if name not in funcs:
                funcs[name] = self._lookup(module, name)
            self._calls.append((funcs[name], tuple(self._tvm[a] for a in args)))

        self.output_structure: Mapping[str, Any] = plan.get("output_structure") or _default_structure(
            len(self._out_views)
        )
        # Check the structure now, with placeholders, rather than at the first call.
        unflatten_outputs(self.output_structure, list(range(len(self._out_views))))

    def _spec(self, entry: Mapping[str, Any], role: str) -> TensorSpec:
        name, tid = entry.get("name"), entry.get("tensor")
        if tid not in self._views:
            raise PlanError(f"{role} {name!r}: tensor {tid!r} does not exist in the plan")
        view = self._views[tid]
        return TensorSpec(str(name), tuple(view.shape), str(np.dtype(view.dtype)))

    def _bind_params(
        self, entries: list[Mapping[str, Any]], params: Mapping[str, np.ndarray]
    ) -> None:
        missing = [e.get("name") for e in entries if e.get("name") not in params]
        if missing:
            raise PlanError(
                f"params missing for the plan: {missing}; pass the params file that was "
                f"exported with this plan"
            )
        for e in entries:
            name, tid = e.get("name"), e.get("tensor")
            if tid not in self._views:
                raise PlanError(f"param {name!r}: tensor {tid!r} does not exist in the plan")
            view, value = self._views[tid], np.asarray(params[name])
            if value.shape != view.shape or value.dtype != view.dtype:
                raise PlanError(
                    f"param {name!r}: the plan expects shape {tuple(view.shape)} {view.dtype}, "
                    f"the params give {value.shape} {value.dtype}; the params do not belong "
                    f"to this plan"
                )
            self._upload(view, value)

    # Where the tensors live: host memory here; CudaExecutor puts them on the GPU.
    def _setup_device(self) -> None:
        pass

    def _allocate(self, nbytes: int) -> Any:
        return _aligned_buffer(nbytes)

    def _view(self, storage: Any, offset: int, nbytes: int, shape: tuple[int, ...],
              dtype: np.dtype) -> tuple[Any, Any]:
        """(the tensor's own handle, its TVM tensor) over bytes [offset, +nbytes)."""
        view = storage[offset : offset + nbytes].view(dtype).reshape(shape)
        return view, _tvm.from_dlpack(view)

    def _upload(self, view: Any, value: np.ndarray) -> None:
        np.copyto(view, value)

    @staticmethod
    def _lookup(module: Any, name: Any) -> Callable[..., Any]:
        try:
            func = module[name]
        except (AttributeError, KeyError, RuntimeError, TypeError) as exc:
            raise PlanError(
                f"kernel {name!r} named by the plan is not in the library; the plan and "
                f"the library were not built together ({exc})"
            ) from exc
        if func is None or not callable(func):
            raise PlanError(f"kernel {name!r} named by the plan is not in the library")
        return func

    def _check_inputs(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        specs = self.input_specs
        if len(inputs) != len(specs):
            expected = ", ".join(f"{s.name}: {s.describe()}" for s in specs)
            raise ValueError(
                f"expected {len(specs)} input(s) ({expected}), got {len(inputs)}"
            )
        arrays = []
        for i, (spec, x) in enumerate(zip(specs, inputs, strict=True)):
            a = np.asarray(x)
            if a.shape != spec.shape or a.dtype != self._in_views[i].dtype:
                raise ValueError(
                    f"input {spec.name!r} (#{i}): expected shape {spec.describe()}, "
                    f"got {a.shape} {a.dtype}"
                )
            arrays.append(a)
        if self._index_checks:
            check_indices(self._index_checks, arrays)
        return arrays

    def run_flat(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run once; returns a fresh copy of every output, in plan order."""
        for view, a in zip(self._in_views, self._check_inputs(inputs), strict=True):
            np.copyto(view, a)
        for func, args in self._calls:
            func(*args)
        # Copies: the buffers are reused by the next call.
        return [v.copy() for v in self._out_views]

    def profile(self, *inputs: np.ndarray, repeat: int = 20) -> list[tuple[str, float]]:
        """Median seconds of each kernel call, in plan order (after one warm-up run)."""
        self.run_flat(*inputs)
        names = [k["name"] for k in self.plan["kernels"]]
        samples: list[list[float]] = [[] for _ in self._calls]
        for _ in range(repeat):
            for i, (func, args) in enumerate(self._calls):
                start = time.perf_counter()
                func(*args)
                samples[i].append(time.perf_counter() - start)
        return [(n, float(np.median(s))) for n, s in zip(names, samples, strict=True)]

    def run(self, *inputs: np.ndarray) -> Any:
        """Run once; returns the outputs rebuilt per the plan's output_structure."""
        return unflatten_outputs(self.output_structure, self.run_flat(*inputs))

    __call__ = run


class DeviceTensor(NamedTuple):
    """A plan tensor in GPU memory: its shape, dtype and TVM tensor (a view of a storage)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    tensor: Any

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def ptr(self) -> int:
        return int(self.tensor.data_ptr())


class CudaExecutor(Executor):
    """Runs a plan on a CUDA GPU: every storage one device allocation, the params
    uploaded once, and the whole kernel sequence captured as a CUDA graph and replayed
    (`cuda_graph=False`: the kernels are launched one by one).

    Inputs: torch CUDA tensors (any DLPack tensor on the GPU) are read in place, on
    torch's current stream: the kernels get their addresses, and a graph is captured
    for each set of input addresses (up to MAX_GRAPHS; torch's caching allocator
    hands a loop the same few addresses), beyond which the inputs are copied into the
    plan's own input buffers and one graph over those is replayed. numpy arrays and
    CPU tensors are copied in once. Outputs are copied, device to device, out of the
    plan's buffers into fresh tensors (the next call overwrites the buffers): a torch
    caller gets torch tensors on the GPU back, a numpy caller numpy arrays. torch is
    used only when the caller's tensors come from it (never imported here)."""

    MAX_GRAPHS = 4

    def __init__(self, module: Any, plan: Mapping[str, Any],
                 params: Mapping[str, np.ndarray] | None = None, device_index: int = 0,
                 cuda_graph: bool = True) -> None:
        self.device_index = device_index
        self.cuda_graph = cuda_graph
        self._graphs: dict[Any, Any] = {}  # input addresses (None: own buffers) -> graph
        self._warm = False
        super().__init__(module, plan, params)
        # The plan tensors over each input's storage (the input and its reshapes), and
        # the kernel arguments that are such tensors: rebound to the caller's memory.
        by_storage: dict[int, list[tuple[int, int]]] = {}
        for t in plan["tensors"]:
            by_storage.setdefault(t["storage"], []).append((t["id"], t.get("offset", 0)))
        tensors = {t["id"]: t for t in plan["tensors"]}
        self._input_tensors = [by_storage[tensors[e["tensor"]]["storage"]]
                               for e in plan["inputs"]]
        rebound = {tid for group in self._input_tensors for tid, _ in group}
        self._rebound_args = [
            (i, [j for j, a in enumerate(k["args"]) if a in rebound])
            for i, k in enumerate(plan["kernels"]) if any(a in rebound for a in k["args"])]
        self._arg_ids = [list(k["args"]) for k in plan["kernels"]]

    def _setup_device(self) -> None:
        from . import cuda

        self._cuda = cuda
        self.device = cuda.cuda_device(self.device_index)
        self._stream = cuda.new_stream()

    def _allocate(self, nbytes: int) -> Any:
        # one allocation per storage (cudaMalloc returns 256-byte aligned memory)
        return _tvm.empty((max(nbytes, 1),), "uint8", self.device)

    def _view(self, storage: Any, offset: int, nbytes: int, shape: tuple[int, ...],
              dtype: np.dtype) -> tuple[Any, Any]:
        tensor = _tvm.create_view(storage, shape, str(dtype), offset)
        return DeviceTensor(shape, dtype, tensor), tensor

    def _upload(self, view: Any, value: np.ndarray) -> None:
        value = np.ascontiguousarray(value, dtype=view.dtype)
        self._cuda.copy_async(view.ptr, value.ctypes.data, view.nbytes, self._stream)
        self._cuda.synchronize(self._stream)

    # ------------------------------------------------------------------ running

    def _launch_all(self, calls: list | None = None) -> None:
        for func, args in calls or self._calls:
            func(*args)

    def _rebind(self, gpu_inputs: list[Any]) -> list:
        """The kernel calls with the input storages' tensors over the caller's tensors."""
        bound: dict[int, Any] = {}
        for x, group in zip(gpu_inputs, self._input_tensors, strict=True):
            base = _tvm.from_dlpack(x)
            for tid, offset in group:
                view = self._views[tid]
                bound[tid] = _tvm.create_view(base, view.shape, str(view.dtype), offset)
        calls = list(self._calls)
        for i, positions in self._rebound_args:
            func, args = calls[i]
            args = list(args)
            for j in positions:
                args[j] = bound[self._arg_ids[i][j]]
            calls[i] = (func, tuple(args))
        return calls

    def _run_on(self, stream: int, key: Any, calls: list) -> None:
        # The first run launches the kernels one by one: it loads the modules and sizes
        # TVM's workspaces, which must not happen while a graph is being captured.
        if self.cuda_graph and self._warm:
            graph = self._graphs.get(key)
            if graph is None:
                graph = self._graphs[key] = self._cuda.Graph(
                    self.device, lambda: self._launch_all(calls))
            graph.launch(stream)
            return
        self.device.set_raw_stream(stream)
        try:
            self._launch_all(calls)
        finally:
            self.device.set_raw_stream(0)
        if not self._warm:
            self._cuda.synchronize(stream)
            self._warm = True

    def _torch_of(self, inputs: Sequence[Any]) -> Any:
        """The torch module, when the caller passes torch tensors (already imported)."""
        for x in inputs:
            module = type(x).__module__.split(".")[0]
            if module == "torch":
                return sys.modules.get("torch")
        return None

    def run_flat(self, *inputs: Any) -> list[Any]:
        """Run once; returns a fresh copy of every output: torch tensors on the GPU
        for torch callers whose tensors are on the GPU, torch CPU tensors for torch
        CPU tensors, numpy arrays for numpy arrays."""
        specs = self.input_specs
        if len(inputs) != len(specs):
            expected = ", ".join(f"{s.name}: {s.describe()}" for s in specs)
            raise ValueError(f"expected {len(specs)} input(s) ({expected}), got {len(inputs)}")
        torch = self._torch_of(inputs)
        on_gpu = torch is not None and any(
            isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
        stream = (torch.cuda.current_stream(self.device_index).cuda_stream if on_gpu
                  else self._stream)
        sources = [self._source(x, spec, i, torch)
                   for i, (spec, x) in enumerate(zip(specs, inputs, strict=True))]
        if self._index_checks:
            check_indices(self._index_checks, [x for x, _ in sources])
        in_place = on_gpu and all(
            isinstance(x, torch.Tensor) and x.is_cuda and ptr % ALIGNMENT == 0
            for x, ptr in sources)
        key = tuple(ptr for _, ptr in sources) if in_place else None
        if in_place and self.cuda_graph and self._warm and key not in self._graphs \
                and len(self._graphs) >= self.MAX_GRAPHS:
            in_place, key = False, None  # graphs enough: copy into the own buffers
        if in_place:
            calls = [] if key in self._graphs else self._rebind([x for x, _ in sources])
        else:
            calls = self._calls
            for view, (_, ptr) in zip(self._in_views, sources, strict=True):
                self._cuda.copy_async(view.ptr, ptr, view.nbytes, stream)
        self._run_on(stream, key, calls)
        outputs = []
        for entry, view in zip(self.plan["outputs"], self._out_views, strict=True):
            source = self._output_source(entry["tensor"], view, sources, key)
            if on_gpu:
                out = torch.empty(view.shape, dtype=getattr(torch, view.dtype.name),
                                  device=f"cuda:{self.device_index}")
                ptr = out.data_ptr()
            else:
                out = np.empty(view.shape, view.dtype)
                ptr = out.ctypes.data
            self._cuda.copy_async(ptr, source, view.nbytes, stream)
            outputs.append(out)
        if not on_gpu:
            self._cuda.synchronize(stream)
            if torch is not None:
                outputs = [torch.from_numpy(o) for o in outputs]
        del sources  # the copies' sources stay alive until here
        return outputs

    def _output_source(self, tid: int, view: DeviceTensor, sources: list, key: Any) -> int:
        """The address an output is read from: the caller's input when the output is
        (a view of) an input read in place, else the plan's buffer."""
        if key is not None:
            for (_, ptr), group in zip(sources, self._input_tensors, strict=True):
                for member, offset in group:
                    if member == tid:
                        return ptr + offset
        return view.ptr

    def _source(self, x: Any, spec: TensorSpec, i: int, torch: Any) -> tuple[Any, int]:
        """(an object keeping the data alive, its address) of input `x`, on the GPU or
        on the host, after checking its shape and dtype."""
        if torch is not None and isinstance(x, torch.Tensor):
            x = x.detach()
            if x.is_cuda:
                x = x.contiguous()
                got_shape, got_dtype = tuple(x.shape), str(x.dtype).replace("torch.", "")
                ptr = x.data_ptr()
            else:
                x = np.ascontiguousarray(x.numpy())
        if not (torch is not None and isinstance(x, torch.Tensor)):
            x = np.ascontiguousarray(x)
            got_shape, got_dtype, ptr = x.shape, str(x.dtype), x.ctypes.data
        if got_shape != spec.shape or got_dtype != spec.dtype:
            raise ValueError(f"input {spec.name!r} (#{i}): expected shape {spec.describe()}, "
                             f"got {got_shape} {got_dtype}")
        return x, ptr

    def profile(self, *inputs: Any, repeat: int = 20) -> list[tuple[str, float]]:
        """Median seconds of each kernel call, in plan order (each launch synchronized)."""
        self.run_flat(*inputs)
        names = [k["name"] for k in self.plan["kernels"]]
        samples: list[list[float]] = [[] for _ in self._calls]
        self.device.set_raw_stream(self._stream)
        try:
            for _ in range(repeat):
                for i, (func, args) in enumerate(self._calls):
                    start = time.perf_counter()
                    func(*args)
                    self._cuda.synchronize(self._stream)
                    samples[i].append(time.perf_counter() - start)
        finally:
            self.device.set_raw_stream(0)
        return [(n, float(np.median(s))) for n, s in zip(names, samples, strict=True)]


def make_executor(module: Any, plan: Mapping[str, Any],
                  params: Mapping[str, np.ndarray] | None = None, device: str = "cpu",
                  cuda_graph: bool = True) -> Executor:
    """The executor for `device`: "cpu", or "cuda" / "cuda:N" (a GPU)."""
    kind, _, index = str(device).partition(":")
    if kind == "cpu":
        return Executor(module, plan, params)
    if kind == "cuda":
        return CudaExecutor(module, plan, params, int(index or 0), cuda_graph)
    raise ValueError(f"unknown device {device!r}: use cpu or cuda[:N]")
