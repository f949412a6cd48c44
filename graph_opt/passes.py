"""All graph passes of the pipeline, importable from one place (importing this module
registers them with the pass manager)."""

from tecc.graph_opt.attention import fuse_attention
from tecc.graph_opt.combine_dense import combine_parallel_dense
from tecc.graph_opt.cse import eliminate_common_subexpr, eliminate_dead_code
from tecc.graph_opt.dense_pack import pack_dense_weights
from tecc.graph_opt.fold_batch_norm import fold_batch_norm
from tecc.graph_opt.fold_constant import fold_constants
from tecc.graph_opt.fold_dense_rows import fold_dense_rows
from tecc.graph_opt.fuse_ops import fuse_ops
from tecc.graph_opt.layout import convert_layout_nchwc
from tecc.graph_opt.simplify import simplify

__all__ = ["combine_parallel_dense", "convert_layout_nchwc", "eliminate_common_subexpr",
           "eliminate_dead_code", "fold_batch_norm", "fold_constants", "fold_dense_rows",
           "fuse_attention",
           "fuse_ops", "pack_dense_weights", "simplify"]
