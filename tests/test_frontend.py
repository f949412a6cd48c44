"""The IR, the printer, structural equality and the importer (no kernels needed)."""

import numpy as np
import pytest
import torch
from tecc.frontend.importer import UnsupportedOperatorError, from_torch, load_pt2
from tecc.frontend.ir import (
    Call,
    Constant,
    Function,
    IRTypeError,
    TensorType,
    Var,
    structural_equal,
    structural_hash,
)
from tecc.frontend.ops import Pattern, get_op, registered_ops
from tecc.frontend.printer import astext

from tests.models import MLP, resnet18


def conv_block(weight_seed: int = 0) -> Function:
    x = Var("x", TensorType((1, 8, 10, 10), "float32"))
    w = Constant(np.random.default_rng(weight_seed).standard_normal((16, 8, 3, 3))
                 .astype("float32"))
    y = Call("nn.conv2d", [x, w], {"padding": (1, 1, 1, 1)})
    z = Call("relu", [y])
    return Function([x], Call("add", [z, z]))


def test_types_are_inferred_when_built():
    f = conv_block()
    assert f.body.ty == TensorType((1, 16, 10, 10), "float32")
    x = Var("x", TensorType((2, 3, 7, 5), "float32"))
    w = Constant(np.ones((4, 3, 3, 3), "float32"))
    conv = Call("nn.conv2d", [x, w], {"strides": (2, 2)})
    assert conv.shape == (2, 4, 3, 2)


def test_type_relation_rejects_bad_shapes_and_attrs():
    x = Var("x", TensorType((1, 8, 10, 10), "float32"))
    w = Constant(np.ones((16, 3, 3, 3), "float32"))
    with pytest.raises(IRTypeError, match="channels"):
        Call("nn.conv2d", [x, w])
    with pytest.raises(IRTypeError, match="unknown attributes"):
        Call("relu", [x], {"alpha": 1})
    with pytest.raises(IRTypeError, match="do not broadcast"):
        Call("add", [x, Var("y", TensorType((3, 10), "float32"))])
    with pytest.raises(IRTypeError, match="cannot reshape"):
        Call("reshape", [x], {"newshape": (7, 7)})


def test_every_op_has_a_pattern_kind():
    ops = registered_ops()
    assert {"nn.conv2d", "nn.dense", "nn.matmul", "add", "reshape", "sum"} <= set(ops)
    assert get_op("nn.conv2d").pattern == Pattern.OUT_ELEMWISE_FUSABLE
    assert get_op("add").pattern == Pattern.BROADCAST
    assert get_op("relu").pattern == Pattern.ELEMWISE
    assert get_op("sum").pattern == Pattern.COMM_REDUCE


def test_structural_equality_and_hash():
    a, b, c = conv_block(0), conv_block(0), conv_block(1)
    assert a is not b and a.body != b.body  # identity differs...
    assert structural_equal(a, b)  # ...structure does not
    assert structural_hash(a) == structural_hash(b)
    assert not structural_equal(a, c)  # other weights
    x = Var("x", TensorType((4,), "float32"))
    assert not structural_equal(Function([x], Call("relu", [x])),
                                Function([x], Call("sigmoid", [x])))


def test_printer_shows_ops_attributes_and_types():
    text = astext(conv_block())
    assert text.startswith("fn (%x: Tensor[(1, 8, 10, 10), float32])")
    assert "%0 = nn.conv2d(%x, meta[0]" in text
    assert "padding=[1, 1, 1, 1]" in text
    assert "/* ty=Tensor[(1, 16, 10, 10), float32] */" in text
    assert text.rstrip().endswith("}")


def test_import_records_inputs_outputs_and_source_lines():
    model = MLP().eval()
    imported = from_torch(model, (torch.randn(3, 64),))
    assert [(s.name, s.shape, s.dtype) for s in imported.inputs] == [("x", (3, 64), "float32")]
    assert imported.outputs[0].shape == (3, 10)
    calls = [n for n in imported.func.body.args if isinstance(n, Call)]
    assert any("models.py" in (c.span or "") for c in calls)


class WithNoneOutputs(torch.nn.Module):
    """transformers' models with return_dict=False give (hidden, None) where an optional
    output is off; torch.export keeps each None as a leaf of the output."""

    def forward(self, x):
        return torch.tanh(x), None, {"scaled": x * 3, "absent": None}


def test_none_outputs_keep_their_place_in_the_output():
    import tecc

    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    imported = from_torch(WithNoneOutputs(), (x,))
    assert len(imported.outputs) == 2  # the tensors alone
    got = tecc.compile(WithNoneOutputs(), (x,))(x)
    expected = WithNoneOutputs()(x)
    assert got[1] is None and got[2]["absent"] is None and set(got[2]) == {"scaled", "absent"}
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[2]["scaled"], expected[2]["scaled"])


class TwoUnsupported(torch.nn.Module):
    def forward(self, x):
        a = torch.cumprod(x, dim=1)
        b = torch.flip(x, dims=[0])
        c = torch.flip(a, dims=[1])
        return a + b + c


def test_unsupported_ops_are_all_listed_with_counts_and_lines():
    with pytest.raises(UnsupportedOperatorError) as info:
        from_torch(TwoUnsupported(), (torch.randn(4, 5),))
    message = str(info.value)
    assert "aten.cumprod.default: 1 use(s)" in message
    assert "aten.flip.default: 2 use(s)" in message
    assert "test_frontend.py" in message and "torch.flip(x, dims=[0])" in message
    assert set(info.value.unsupported) == {"aten.cumprod.default", "aten.flip.default"}


def test_pt2_round_trip(tmp_path):
    model = resnet18(num_classes=10).eval()
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path / "resnet.pt2"
    with torch.no_grad():
        torch.export.save(torch.export.export(model, (x,)), str(path))
    assert structural_equal(load_pt2(path).func, from_torch(model, (x,)).func)
