"""Gates of gradient-boosted attention: shapes, exact values, parameter counts, errors."""

import pytest
import torch

from attnlab.model.mechanisms.boost_gates import GATE_KINDS, make_gate


def _inputs(dim: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    F = torch.randn(3, 5, dim, generator=g)
    c = torch.randn(3, 5, dim, generator=g)
    return F, c, torch.rand(3, 5, generator=g)


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_gate_broadcasts_to_F_and_lies_in_unit_interval(kind: str) -> None:
    F, c, entropy = _inputs()
    g = make_gate(kind, 8)(F, c, entropy)
    assert torch.broadcast_shapes(g.shape, F.shape) == F.shape
    assert ((g >= 0) & (g <= 1)).all()


def test_per_dimension_gates_have_full_shape() -> None:
    F, c, entropy = _inputs()
    assert make_gate("linear", 8)(F, c).shape == F.shape
    assert make_gate("mlp", 8)(F, c, entropy.unsqueeze(-1)).shape == F.shape


def test_none_gate_is_exactly_one() -> None:
    F, c, _ = _inputs()
    g = make_gate("none", 8)(F, c)
    assert torch.equal(F + g * c, F + c)
    assert list(make_gate("none", 8).parameters()) == []


def test_parameter_counts() -> None:
    def count(kind: str, dim: int, bias: bool = True) -> int:
        return sum(p.numel() for p in make_gate(kind, dim, bias).parameters())

    assert count("linear", 256) == 2 * 256 * 256 + 256 == 131_328
    assert count("linear", 256, bias=False) == 2 * 256 * 256
    assert count("scalar", 256) == 1
    assert count("mlp", 64) == (2 * 64 + 1) * 32 + 32 + 32 * 64 + 64


def test_scalar_gate_is_sigmoid_of_its_parameter() -> None:
    gate = make_gate("scalar", 4)
    F, c, _ = _inputs(4)
    assert torch.allclose(gate(F, c), torch.sigmoid(next(gate.parameters())))


def test_mlp_gate_needs_entropy() -> None:
    F, c, _ = _inputs()
    with pytest.raises(ValueError, match="entropy"):
        make_gate("mlp", 8)(F, c)


def test_unknown_kind_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="none, scalar, linear, mlp"):
        make_gate("softmax", 8)
