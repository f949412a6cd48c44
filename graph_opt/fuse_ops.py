"""Turn each group of ops that becomes one kernel into a primitive Function.

The `fuse_ops` pass (opt_level >= 1, the last of the pipeline) groups ops by TVM's
FuseOps rule; `primitive_per_op` makes one kernel per op (what the driver does at
opt_level 0). Calls become
`Call(Function(params, body, Primitive=1), args)`; size-1 constants stay inside the
kernel as immediates, every other input becomes a kernel parameter.
"""

from __future__ import annotations

from tecc.frontend.ir import (
    Call,
    Constant,
    Expr,
    Function,
    Tuple,
    TupleGetItem,
    TupleType,
    Var,
    children,
    post_order,
    rewrite,
    with_children,
)
from tecc.frontend.ops import Pattern, get_op
from tecc.graph_opt.pass_manager import PassContext, register_pass

# Anchors whose GPU template normalizes its operands and stages them in shared memory
# (schedules/gpu_matmul.py), inlining the fetch's producers there.
LOAD_FUSING_ANCHORS = frozenset({"nn.dense", "nn.matmul"})
# Row reductions whose GPU template (schedules/gpu_reduce.py) inlines its producers into
# the row's passes: attention's mask add is read with the scores; and the fused
# attention (schedules/gpu_attention.py), whose shared-memory fetches of Q, K and V
# read through the head splits, and whose logits read the mask.
ROW_FUSING_ANCHORS = frozenset({"nn.softmax", "nn.safe_softmax", "nn.log_softmax",
                                "nn.attention"})


def _anchors_take_producers() -> bool:
    """Whether LOAD_FUSING_ANCHORS and ROW_FUSING_ANCHORS take the producer group they
    alone read: GPU targets only."""
    target = PassContext.current().target
    return target is not None and target.is_gpu


def is_primitive_call(expr: Expr) -> bool:
    return isinstance(expr, Call) and isinstance(expr.op, Function) and bool(
        expr.op.attrs.get("Primitive"))


def inlined_as_immediate(arg: Expr) -> bool:
    return isinstance(arg, Constant) and arg.tensor_type.size == 1


def primitive_per_op(func: Function) -> Function:
    """Every op call becomes its own kernel."""

    def visit(node: Expr, new_children: tuple[Expr, ...]) -> Expr | None:
        if not isinstance(node, Call) or not isinstance(node.op, str):
            return None
        inputs = [a for a in new_children if not inlined_as_immediate(a)]
        unique_inputs = list({id(a): a for a in inputs}.values())
        params = [Var(f"p{i}", a.ty) for i, a in enumerate(unique_inputs)]
        by_id = {id(a): p for a, p in zip(unique_inputs, params, strict=True)}
        inner = Call(node.op, [by_id.get(id(a), a) for a in new_children], node.attrs, node.span)
        prim = Function(params, inner, {"Primitive": 1, "name_hint": node.op.replace(".", "_")})
        return Call(prim, unique_inputs, span=node.span)

    return rewrite(func, visit)


# ---------------------------------------------------------------- operator fusion
# TVM's FuseOps rule over the post-dominator tree. Each op call starts in its own
# group; a group is merged into the group of its immediate post-dominator when
# every op on the way allows it:
#   phase 0: an out-elemwise-fusable anchor (conv2d, dense, pool) takes its
#            elementwise/broadcast epilogue;
#   phase 0-1: elementwise/broadcast ops fuse into an injective, reduction or
#            anchor consumer; phase 1: injective chains fuse together.
# On GPU targets, phase 1 also lets an injective group fuse into the matmul it
# alone feeds (LOAD_FUSING_ANCHORS): the GEMM's shared-memory fetch reads the
# producer's source through the composed index, so attention's head splits and
# merges cost no kernel and no round trip through memory; and a softmax takes the
# elementwise, broadcast or injective group it alone reads (ROW_FUSING_ANCHORS: the
# mask add), read in the row's passes. On the CPU the templates pack or pad their
# operands and were tuned on plain inputs: unchanged.
# Calls producing tuples (split), tuples and tuple items stay at group borders.


class _Group:
    __slots__ = ("parent", "pattern", "size")

    def __init__(self, pattern: Pattern) -> None:
        self.parent: _Group | None = None
        self.pattern = pattern
        self.size = 1

    def root(self) -> _Group:
        group = self
        while group.parent is not None:
            group = group.parent
        # Path compression keeps later lookups short.
        node = self
        while node.parent is not None and node.parent is not group:
            node.parent, node = group, node.parent
        return group


def _fusible(node: Expr) -> bool:
    return (isinstance(node, Call) and isinstance(node.op, str)
            and not isinstance(node.ty, TupleType))


def _pattern(node: Expr) -> Pattern:
    return get_op(node.op).pattern if _fusible(node) else Pattern.OPAQUE


def _edge_pattern(consumer: Expr, arg: Expr) -> Pattern:
    """As TVM: a broadcast op reading an input of its own output shape is, along
    that edge, elementwise."""
    kind = _pattern(consumer)
    if kind == Pattern.BROADCAST and arg.ty == consumer.ty:
        return Pattern.ELEMWISE
    return kind


def fuse_groups(func: Function, max_depth: int = 64) -> dict[int, int]:
    """Group the op calls of `func`: id(call) -> group number (shared by fused calls)."""
    nodes = post_order(func.body)
    index = {id(n): i for i, n in enumerate(nodes)}
    consumers: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for c in children(n):
            if i not in consumers[index[id(c)]]:
                consumers[index[id(c)]].append(i)
    outputs = {index[id(f)] for f in (func.body.fields if isinstance(func.body, Tuple)
                                      else (func.body,))}

    # Immediate post-dominators (None: the function output) and tree depths.
    ipdom: list[int | None] = [None] * len(nodes)
    depth = [0] * len(nodes)

    def lca(a: int | None, b: int | None) -> int | None:
        while a is not None and b is not None and a != b:
            if depth[a] >= depth[b]:
                a = ipdom[a]
            else:
                b = ipdom[b]
        return a if a == b else None

    for i in reversed(range(len(nodes))):
        if i in outputs or not consumers[i] or not _fusible(nodes[i]):
            ipdom[i], depth[i] = None, 1
            continue
        dom: int | None = consumers[i][0]
        for c in consumers[i][1:]:
            dom = lca(dom, c)
        if dom is not None and not _fusible(nodes[dom]):
            dom = None
        ipdom[i] = dom
        depth[i] = depth[dom] + 1 if dom is not None else 1

    groups = [_Group(_pattern(n)) for n in nodes]
    takes_producers = _anchors_take_producers()

    def check_path(src: int, sink: int, fcond) -> bool:
        seen: set[int] = set()
        stack = list(consumers[src])
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if not _fusible(nodes[n]):
                return False
            if not fcond(groups[n].root().pattern, n == sink):
                return False
            if n != sink:
                stack.extend(consumers[n])
        return True

    def commit(src: int, sink: int) -> None:
        target = groups[sink].root()
        seen: set[int] = set()
        stack = [src]
        while stack:
            n = stack.pop()
            if n in seen or n == sink:
                continue
            seen.add(n)
            g = groups[n].root()
            if g is not target:
                g.parent = target
                target.pattern = max(target.pattern, g.pattern)
                target.size += g.size
            stack.extend(consumers[n])

    def path_size(src: int, sink: int) -> int:
        roots = {id(groups[src].root()): groups[src].root(),
                 id(groups[sink].root()): groups[sink].root()}
        stack, seen = list(consumers[src]), set()
        while stack:
            n = stack.pop()
            if n in seen or n == sink:
                continue
            seen.add(n)
            roots[id(groups[n].root())] = groups[n].root()
            stack.extend(consumers[n])
        return sum(g.size for g in roots.values())

    for phase in range(2):
        for i, node in enumerate(nodes):
            if not _fusible(node) or ipdom[i] is None:
                continue
            dom = ipdom[i]
            group = groups[i].root()
            if group is groups[dom].root() or group.pattern == Pattern.OPAQUE:
                continue
            dom_edge = max(_edge_pattern(nodes[c], node) for c in consumers[i])
            # on a GPU, the anchor `dom` this group alone feeds takes it as a producer
            taker = nodes[dom].op if takes_producers and consumers[i] == [dom] else None
            into_load, into_rows = taker in LOAD_FUSING_ANCHORS, taker in ROW_FUSING_ANCHORS
            if group.pattern == Pattern.OUT_ELEMWISE_FUSABLE:
                if phase != 0 or dom_edge != Pattern.ELEMWISE:
                    continue
                ok = check_path(i, dom, lambda kind, is_sink: kind <= Pattern.BROADCAST)
            elif group.pattern <= Pattern.BROADCAST:
                if not (dom_edge <= Pattern.INJECTIVE or dom_edge == Pattern.COMM_REDUCE
                        or into_rows):
                    continue
                sinks = (Pattern.COMM_REDUCE, Pattern.OUT_ELEMWISE_FUSABLE) \
                    + ((Pattern.OPAQUE,) if into_rows else ())
                ok = check_path(i, dom, lambda kind, is_sink, sinks=sinks:
                                kind <= Pattern.INJECTIVE or is_sink and kind in sinks)
            elif group.pattern == Pattern.INJECTIVE:
                if phase != 1:
                    continue
                sinks = (Pattern.COMM_REDUCE,) \
                    + ((Pattern.OUT_ELEMWISE_FUSABLE,) if into_load else ()) \
                    + ((Pattern.OPAQUE,) if into_rows else ())
                ok = check_path(i, dom, lambda kind, is_sink, sinks=sinks:
                                kind <= Pattern.INJECTIVE or is_sink and kind in sinks)
            else:  # reductions and opaque ops end their group
                continue
            if ok and path_size(i, dom) <= max_depth:
                commit(i, dom)

    numbering: dict[int, int] = {}
    result: dict[int, int] = {}
    for n, g in zip(nodes, groups, strict=True):
        if isinstance(n, Call) and isinstance(n.op, str):  # tuple-valued ops stay alone
            result[id(n)] = numbering.setdefault(id(g.root()), len(numbering))
    return result


@register_pass("fuse_ops", opt_level=1)
def fuse_ops(func: Function, max_depth: int = 64) -> Function:
    """Fuse op calls into primitive Functions (one kernel each) by FuseOps' rule; at
    most `max_depth` ops in a group."""
    group_of = fuse_groups(func, max_depth)
    nodes = post_order(func.body)
    members: dict[int, list[Expr]] = {}
    for n in nodes:
        if id(n) in group_of:
            members.setdefault(group_of[id(n)], []).append(n)
    used_outside: set[int] = set()
    for n in nodes:
        for c in children(n):
            if id(c) in group_of and group_of.get(id(n)) != group_of[id(c)]:
                used_outside.add(id(c))
    for f in (func.body.fields if isinstance(func.body, Tuple) else (func.body,)):
        used_outside.add(id(f))

    new: dict[int, Expr] = {}  # old node id -> expression in the fused function

    for n in nodes:
        if id(n) not in group_of:
            if id(n) not in new:
                new[id(n)] = with_children(n, tuple(new.get(id(c), c) for c in children(n)))
            continue
        gid = group_of[id(n)]
        group_nodes = members[gid]
        if n is not group_nodes[-1]:
            continue  # a group is built at its last member: its inputs exist by then
        group_ids = {id(m) for m in group_nodes}
        inputs: list[Expr] = []
        for m in group_nodes:
            for c in children(m):
                if id(c) not in group_ids and not inlined_as_immediate(c) and all(
                        c is not x for x in inputs):
                    inputs.append(c)
        params = [Var(f"p{k}", x.ty) for k, x in enumerate(inputs)]
        inner: dict[int, Expr] = {id(x): p for x, p in zip(inputs, params, strict=True)}
        for m in group_nodes:
            inner[id(m)] = with_children(m, tuple(inner.get(id(c), c) for c in children(m)))
        outs = [m for m in group_nodes if id(m) in used_outside]
        body = inner[id(outs[0])] if len(outs) == 1 else Tuple([inner[id(o)] for o in outs])
        ops = [m.op for m in group_nodes]
        anchor = max(group_nodes, key=_pattern)  # the first of the highest kind
        prim = Function(params, body, {"Primitive": 1, "name_hint": "_".join(
            dict.fromkeys(o.replace("nn.", "") for o in ops)), "anchor": anchor.op})
        call = Call(prim, [new.get(id(x), x) for x in inputs], span=anchor.span)
        if len(outs) == 1:
            new[id(outs[0])] = call
        else:
            for k, o in enumerate(outs):
                new[id(o)] = TupleGetItem(call, k)
    body = new.get(id(func.body), func.body)
    return Function(func.params, body, func.attrs)

