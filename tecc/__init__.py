"""tecc: compile PyTorch models to fast CPU and GPU code with TVM."""

from tecc.api import CompiledModel, __version__, compile, import_model, load

__all__ = ["CompiledModel", "__version__", "compile", "import_model", "load"]
