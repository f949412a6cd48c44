"""Tuning records that cannot break a load or win by forgery: malformed numbers and
targets are skipped and counted, only finite positive costs count, a config outside
its template's space is skipped for the next-best valid one, and a torn last line
does not swallow the next run's first record."""

import json
import warnings

import numpy as np
import pytest
import torch
from tecc.autotune.records import Record, RecordDatabase, RecordWriter, load_records

import tecc
from tecc.target import target_to_json

AVX2 = {"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2}
DENSE = {"template": "dense", "shapes": [[64, 128], [256, 128]], "dtype": "float32"}


def line(**overrides) -> str:
    data = {"version": 1, "target": AVX2, "workload": DENSE, "config": {"tile": 4},
            "costs_s": [1e-3], "error": None, "timestamp": 1.0}
    data.update(overrides)
    return json.dumps(data)


def load_lines(tmp_path, lines: list[str]) -> tuple[list[Record], int, list]:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(text + "\n" for text in lines))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, skipped = load_records(path)
    return records, skipped, [str(w.message) for w in caught]


def test_huge_numbers_and_bad_targets_are_skipped_and_counted(tmp_path):
    huge = "9" * 400
    lines = [line(config={"tile": 8}),
             line().replace('"costs_s": [0.001]', f'"costs_s": [{huge}]'),
             line().replace('"timestamp": 1.0', f'"timestamp": {huge}'),
             line(target="llvm"), line(target=None), line(host="x")]
    records, skipped, messages = load_lines(tmp_path, lines)
    assert skipped == 5 and [r.config for r in records] == [{"tile": 8}]
    assert len(messages) == 1 and "skipped 5 broken" in messages[0]


@pytest.mark.parametrize("cost", ["-1000.0", "0", "0.0", "true", "NaN", "Infinity",
                                  "-Infinity", '"1e-3"'])
def test_a_cost_that_is_not_finite_and_positive_makes_the_line_invalid(tmp_path, cost):
    bad = line(config={"tile": 16}).replace('"costs_s": [0.001]', f'"costs_s": [{cost}]')
    # first in the file (NaN compared first would win) and among valid costs
    mixed = line(config={"tile": 32}).replace('"costs_s": [0.001]',
                                              f'"costs_s": [0.001, {cost}]')
    records, skipped, messages = load_lines(tmp_path, [bad, mixed, line(config={"tile": 8})])
    assert skipped == 2 and len(messages) == 1
    choice = RecordDatabase(records).choose(DENSE, AVX2)
    assert choice.config == {"tile": 8} and choice.cost_s == pytest.approx(1e-3)


def test_a_forged_verify_session_does_not_win(tmp_path):
    forged = [line(config={"tile": 16}, costs_s=[-1], verify="s9", timestamp=99.0)] * 3
    session = [line(config={"tile": 8}, costs_s=[2e-3], verify="s1")] * 3
    records, skipped, _ = load_lines(tmp_path, forged + session + [line()])
    assert skipped == 3
    assert RecordDatabase(records).choose(DENSE, AVX2).config == {"tile": 8}


def test_records_show_prints_no_forged_best(tmp_path, capsys):
    from tecc.cli import main

    path = tmp_path / "r.jsonl"
    path.write_text(line(costs_s=[-1.0]) + "\n" + line(costs_s=[2e-3]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main(["records", "show", str(path)])
    out = capsys.readouterr().out
    assert "-1000" not in out and "2.0000 ms" in out


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(line() + "\n" + line()[:40])  # the write was cut mid-line
    with RecordWriter(path) as writer:
        writer.write(Record(AVX2, DENSE, {"tile": 8}, [1e-3]))
        writer.write(Record(AVX2, DENSE, {"tile": 16}, [1e-3]))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        records, skipped = load_records(path)
    assert skipped == 1 and [r.config for r in records] == [{"tile": 4}, {"tile": 8},
                                                             {"tile": 16}]
    # a file ending in a newline gets no blank line
    before = path.read_text()
    with RecordWriter(path) as writer:
        writer.write(Record(AVX2, DENSE, {"tile": 32}, [1e-3]))
    assert path.read_text().startswith(before) and "\n\n" not in path.read_text()


# -- configs outside the template's space, at compile time

def _next_best_wins(tmp_path, model, x, template: str, changes: dict, knob: str,
                    value) -> list[str]:
    """Compile with two records of the model's one kernel: a valid config (the fallback
    with `changes`) and, faster, the same with `knob` set to `value`; the valid one must
    be used and the result match torch. The compile's warnings."""
    want = model(x).detach().numpy()
    cm = tecc.compile(model, [x])
    (task,) = [t for t in cm.tasks() if t["template"] != "injective"]
    assert task["template"] == template
    good = dict(task["config"], **changes)
    assert good != task["config"]
    path = tmp_path / "records.jsonl"
    with open(path, "w") as f:
        for config, cost in ((dict(good, **{knob: value}), 1e-6), (good, 1e-3)):
            f.write(json.dumps({"version": 1, "target": target_to_json(cm.target),
                                "workload": task["workload"], "config": config,
                                "costs_s": [cost], "error": None}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned = tecc.compile(model, [x], records=[path])
    (got,) = [t for t in tuned.tasks() if t["template"] != "injective"]
    assert got["source"] == "exact" and got["config"] == good
    np.testing.assert_allclose(tuned(x).numpy(), want, rtol=1e-4, atol=1e-4)
    return [str(w.message) for w in caught if "outside" in str(w.message)]


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.mark.parametrize("tile_n", [0, "abc", None, 1.5, -16, True, [16]])
def test_a_dense_config_outside_the_space_loses_to_the_next_best(tmp_path, tile_n):
    torch.manual_seed(0)
    invalid = _next_best_wins(tmp_path, _Linear().eval(), torch.randn(4, 64), "dense",
                              {"tile_n": 32, "order": "k_mn"}, "tile_n", tile_n)
    assert len(invalid) == 1 and "1 tuning record" in invalid[0]


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


@pytest.mark.parametrize("ic_bn", [-8, 0, 3, "8", None])
def test_a_conv_block_outside_the_space_loses_to_the_next_best(tmp_path, ic_bn):
    torch.manual_seed(0)
    invalid = _next_best_wins(tmp_path, _Conv().eval(), torch.randn(1, 16, 10, 10),
                              "conv2d_NCHWc", {"oc_bn": 8, "tile_ow": 1}, "ic_bn", ic_bn)
    assert len(invalid) == 1


# -- one tuning run per records file; build folders of killed runs

def test_a_second_tune_on_one_records_file_is_refused(tmp_path):
    import fcntl

    from tecc.autotune.records import RecordsBusyError

    path = tmp_path / "r.jsonl"
    path.write_text(line() + "\n")
    with open(path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running tune holds it
        with pytest.raises(RecordsBusyError, match="another tuning run"):
            tecc.tune(_Linear().eval(), (torch.randn(4, 64),), records=path, trials=1,
                      tuner="random", progress=False)
    assert path.read_text() == line() + "\n"


def test_build_folders_of_dead_runs_are_removed(tmp_path, monkeypatch):
    import os
    import subprocess
    import tempfile

    from tecc.autotune import builder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    root = builder.build_root()
    orphan, alive = root / f"{dead.pid}-abc", root / f"{os.getppid()}-def"
    for folder in (orphan, alive):
        folder.mkdir(parents=True)
        (folder / "k.so").write_bytes(b"x")
    with builder.LocalBuilder(n_parallel=1) as built:
        assert os.path.dirname(built.out_dir) == str(root)
        assert os.path.basename(built.out_dir).startswith(f"{os.getpid()}-")
        assert not orphan.exists() and alive.exists()
    assert not os.path.exists(built.out_dir)


def test_tecc_tune_on_a_busy_records_file_says_so(tmp_path, monkeypatch):
    import fcntl

    from tecc.cli import main

    path = tmp_path / "r.jsonl"
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent.parent))
    with open(path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SystemExit, match="tecc tune: another tuning run is writing"):
            main(["tune", "tests.models:mlp_example", "--records", str(path), "--trials",
                  "1", "--tuner", "random"])


# -- the space check is the same for every template: the next-best valid record wins

def _wrong_value(option):
    """A value a record might hold for a knob of options like `option`, but no option:
    of the wrong JSON type, or a split of the wrong length."""
    if isinstance(option, tuple):
        return list(option) + [1]
    if isinstance(option, bool):
        return int(option)
    if isinstance(option, int):
        return float(option)
    return option + "_x"


class _Unary(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


CASES = {
    "injective": (lambda: _Unary(lambda x: torch.relu(x * 2.0 + 1.0)), (8, 64), 3),
    "pool": (lambda: torch.nn.MaxPool2d(3, 2, 1), (1, 16, 14, 14), 3),
    "reduce": (lambda: _Unary(lambda x: x.sum(dim=-1)), (8, 256), 3),
    "softmax": (lambda: torch.nn.Softmax(dim=-1), (8, 256), 3),
    "layer_norm": (lambda: torch.nn.LayerNorm(256), (8, 256), 3),
    "depthwise_conv2d_NCHWc": (lambda: torch.nn.Conv2d(32, 32, 3, 1, 1, groups=32),
                               (1, 32, 14, 14), 3),
    "conv2d_winograd_NCHWc": (lambda: torch.nn.Conv2d(32, 32, 3, 1, 1), (1, 32, 28, 28), 3),
    "conv2d": (lambda: torch.nn.Conv2d(16, 32, 3, 1, 1), (1, 16, 10, 10), 0),
}


@pytest.mark.parametrize("template", sorted(CASES))
def test_every_templates_config_outside_the_space_loses_to_the_next_best(tmp_path, template):
    from tecc.schedules.tasks import extract_tasks

    from tecc.api import fused_graph

    make, shape, opt_level = CASES[template]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    want = model(x).detach().numpy()
    _, fused, _, _, info = fused_graph(model, [x], "llvm", opt_level, None, None, {})
    tasks = [t for t in extract_tasks(fused, info.tvm_target) if t.template == template]
    assert len(tasks) == 1, [t.template for t in extract_tasks(fused, info.tvm_target)]
    task = tasks[0]
    space, fallback = task.space, task.fallback_config()
    # a valid config other than the fallback (the layout knobs kept: the graph's
    # layout follows the record, the kernel reads it)
    layout = {"ic_bn", "oc_bn", "c_bn"}
    good = next(c for c in space if c.index != fallback.index and all(
        c[k] == fallback[k] for k in layout & set(c))).to_json()
    knob = next(k for k in space.knobs if len(k) > 1 and k.name not in layout)
    bad = dict(good, **{knob.name: _wrong_value(fallback[knob.name])})
    assert not space.contains(bad)
    path = tmp_path / "records.jsonl"
    with open(path, "w") as f:
        for config, cost in ((bad, 1e-7), (good, 1e-3)):
            f.write(json.dumps({"version": 1, "target": target_to_json(info.tvm_target),
                                "workload": task.workload, "config": config,
                                "costs_s": [cost], "error": None}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned = tecc.compile(model, [x], opt_level=opt_level, records=[path])
    (got,) = [t for t in tuned.tasks() if t["template"] == template]
    assert got["source"] == "exact" and got["config"] == good
    np.testing.assert_allclose(tuned(x).numpy(), want, rtol=1e-4, atol=1e-4)
    outside = [str(w.message) for w in caught if "outside" in str(w.message)]
    assert len(outside) == 1 and "1 tuning record" in outside[0]
