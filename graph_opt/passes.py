"""All graph passes of the optimization pipeline, importable from one place
(importing this module registers them with the pass manager)."""

from tecc.graph_opt.cse import eliminate_common_subexpr, eliminate_dead_code
from tecc.graph_opt.fold_batch_norm import fold_batch_norm
from tecc.graph_opt.fold_constant import fold_constants
from tecc.graph_opt.simplify import simplify

__all__ = ["eliminate_common_subexpr", "eliminate_dead_code", "fold_batch_norm",
           "fold_constants", "simplify"]
