"""Bad input to the filter: each error names what is wrong and where (issue 2, section 3)."""

from __future__ import annotations

import math

import pytest
import torch

from kpo import kalman_filter, kalman_gains


def test_non_floating_z_is_a_type_error():
    with pytest.raises(
        TypeError, match=r"floating-point tensor, got torch.int64: convert it with z.float\(\)"
    ):
        kalman_filter(torch.ones(2, 3, dtype=torch.int64))


def test_a_numpy_array_is_told_to_become_a_tensor():
    import numpy as np

    with pytest.raises(
        TypeError, match=r"z must be a torch tensor, got numpy.ndarray: .*torch.from_numpy\(z\)"
    ):
        kalman_filter(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(TypeError, match=r"got builtins.list: pass a floating-point torch.Tensor$"):
        kalman_filter([[0.0, 1.0]])


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 3\)"):
        kalman_filter(torch.ones(2, 3), torch.ones(2, 4, dtype=torch.bool))


def test_bad_rank():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        kalman_filter(torch.ones(2, 3, 4))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"q": 0.0}, "q"),
        ({"q": -1e-6}, "q"),
        ({"v": 0.0}, "v"),
        ({"p0": -1.0}, "p0"),
        ({"q": math.nan}, "q must be finite"),
        ({"v": math.inf}, "v must be finite"),
        ({"x0": math.inf}, "x0 must be finite"),
    ],
)
def test_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kalman_filter(torch.ones(2, 3), **kwargs)
    if "x0" not in kwargs:
        with pytest.raises(ValueError, match=match):
            kalman_gains(3, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"q": None}, "q must be a real number, got NoneType"),
        ({"x0": "0.1"}, "x0 must be a real number, got str"),
        ({"v": True}, "v must be a real number, got bool"),
    ],
)
def test_parameters_of_the_wrong_type_are_named(kwargs, match):
    with pytest.raises(TypeError, match=match):
        kalman_filter(torch.ones(2, 3), **kwargs)


def test_parameters_that_overflow_float64_are_rejected():
    # each is finite, but p0 + q overflows in the first variance update (the gains would be inf/inf = NaN)
    with pytest.raises(ValueError, match="overflow float64.*divide all three by the same factor"):
        kalman_filter(torch.ones(2, 3), q=1e308, p0=1e308)
    with pytest.raises(ValueError, match="overflow float64"):
        kalman_filter(torch.ones(2, 3), q=1e200, v=1e200, mask_mode="advance")


def test_non_finite_at_valid_position_names_count_and_first():
    z = torch.zeros(3, 6)
    z[1, 4] = math.nan
    z[2, 0] = math.inf
    z[0, 5] = math.nan  # masked below: ignored
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, 5] = False
    for mode in ("skip", "advance", "zero"):
        with pytest.raises(ValueError, match=r"2 NaN/Inf.*\(1, 4\)"):
            kalman_filter(z, mask, mask_mode=mode)
    z[1, 4] = z[2, 0] = 0.0
    assert bool(torch.isfinite(kalman_filter(z, mask)).all())  # NaN under the mask is never read


def test_unknown_mode_lists_the_modes():
    with pytest.raises(ValueError, match="skip.*advance.*zero"):
        kalman_filter(torch.ones(3), mask_mode="drop")


def test_mask_values_other_than_0_1():
    with pytest.raises(ValueError, match=r"only 0 and 1.*index \(0, 1\)"):
        kalman_filter(torch.ones(1, 3), torch.tensor([[1.0, 0.5, 0.0]]))
    # 0/1 floats and ints are accepted and mean what bool means
    out = kalman_filter(torch.ones(1, 3), torch.tensor([[1, 0, 1]]))
    torch.testing.assert_close(out, kalman_filter(torch.ones(1, 3), torch.tensor([[True, False, True]])))


def test_empty():
    assert kalman_filter(torch.ones(4, 0), torch.ones(4, 0)).shape == (4, 0)
    assert kalman_gains(0).shape == (0,)


def test_backend_is_checked_and_named():
    with pytest.raises(
        ValueError, match=r"backend \(or KPO_FILTER_BACKEND\) must be one of .*'reference'.*got 'gpu'"
    ):
        kalman_filter(torch.ones(2, 3), backend="gpu")


def test_the_backend_keyword_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("KPO_FILTER_BACKEND", "bogus")
    with pytest.raises(ValueError, match="got 'bogus'"):
        kalman_filter(torch.ones(2, 3))
    assert kalman_filter(torch.ones(2, 3), backend="torch").shape == (2, 3)


def test_reference_backend_is_the_float64_loop_through_the_public_checks():
    from kpo.filter.reference import kalman_filter_reference

    z = torch.linspace(-1, 1, 12, dtype=torch.float32).reshape(2, 6)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    out = kalman_filter(z, mask, q=1e-2, p0=0.3, x0=0.1, mask_mode="advance", backend="reference")
    ref = kalman_filter_reference(z, mask, q=1e-2, p0=0.3, x0=0.1, mask_mode="advance")
    assert out.dtype == torch.float32 and torch.equal(out, ref.float())
    with pytest.raises(ValueError, match="NaN/Inf"):
        kalman_filter(torch.tensor([[0.0, float("nan")]]), backend="reference")
    with pytest.raises(RuntimeError, match="no gradient"):
        kalman_filter(z.requires_grad_(), backend="reference")
