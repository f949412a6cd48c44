"""The wheel: tecc is the only top-level package it installs."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("frontend", "graph_opt", "schedules", "autotune", "runtime")


def test_wheel_installs_only_the_tecc_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("tecc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"tecc"}, top
    for stage in STAGES:
        assert f"tecc/{stage}/__init__.py" in names, stage
    assert "tecc/schedules/templates_conv.py" in names
