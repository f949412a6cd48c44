"""Shared test configuration: a summary of model errors at the end of the run."""

MODEL_ERRORS: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter):
    if MODEL_ERRORS:
        terminalreporter.write_sep("-", "max relative error against torch eager")
        for name, err in sorted(MODEL_ERRORS.items()):
            terminalreporter.write_line(f"{name:20s} {err:.2e}")
