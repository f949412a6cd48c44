"""The op definitions, one module per family. Importing this package registers every
op, with its ATen converters, in tecc.frontend.ops.OPS; a new op is one
`OPS.register(...)` (and its converter) in the module of its family."""

from tecc.frontend.op_defs import (  # noqa: F401
    attention,
    elementwise,
    linalg,
    nn,
    reduce,
    transform,
)
