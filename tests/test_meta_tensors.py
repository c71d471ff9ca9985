"""Tensors on the meta device (shapes without values, as a model built under torch.device("meta") gives) are refused
at kpo's public entry points in one line, naming the argument: they got torch's "Tensor.item() cannot be called on
meta tensors" (or "Cannot copy out of meta tensor") from inside kpo's checks."""

from __future__ import annotations

import pytest
import torch

import kpo
from kpo.filter.fit import fit_q


def _meta(*shape) -> torch.Tensor:
    return torch.zeros(*shape, device="meta")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: kpo.kalman_filter(_meta(2, 3)), "z"),
        (lambda: kpo.kalman_filter(torch.zeros(2, 3), torch.ones(2, 3, device="meta")), "mask"),
        (
            lambda: kpo.policy_loss(
                "kpo",
                log_prob=_meta(2, 3),
                old_log_prob=_meta(2, 3),
                advantages=_meta(2),
                response_mask=torch.ones(2, 3, device="meta"),
            ),
            "log_prob",
        ),
        (
            lambda: kpo.policy_loss(
                "vanilla",
                log_prob=-torch.ones(2, 3),
                old_log_prob=-torch.ones(2, 3),
                advantages=_meta(2),
                response_mask=torch.ones(2, 3),
            ),
            "advantages",
        ),
        (lambda: kpo.compute_advantages("grpo", _meta(4), [0, 0, 1, 1]), "rewards"),
        (lambda: kpo.token_dynamics(_meta(2, 8)), "log_ratio"),
        (lambda: fit_q(_meta(2, 8)), "log_ratio"),
    ],
)
def test_a_meta_tensor_is_refused_by_name(call, name):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == (
        f"{name} is on the meta device (a shape without values, as a model built under torch.device('meta') gives): "
        "kpo computes on values; load the weights, or move it to cpu or cuda"
    )
