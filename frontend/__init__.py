# Every op definition is loaded with the package, so that the registry that Calls are
# checked against is complete whichever frontend module is imported first.
from tecc.frontend import op_defs  # noqa: F401
