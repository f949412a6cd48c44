"""Shared test configuration: a summary of model errors at the end of the run, gathered
from every worker when the run is spread over processes (pytest-xdist)."""

import pytest

MODEL_ERRORS: dict[str, float] = {}


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the errors to the controller
        workeroutput["model_errors"] = dict(MODEL_ERRORS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    MODEL_ERRORS.update(getattr(node, "workeroutput", {}).get("model_errors", {}))


def pytest_terminal_summary(terminalreporter):
    if MODEL_ERRORS:
        terminalreporter.write_sep("-", "max relative error against torch eager")
        for name, err in sorted(MODEL_ERRORS.items()):
            terminalreporter.write_line(f"{name:20s} {err:.2e}")
