"""Records every policy-loss call verl's actor makes inside its Ray workers, and every response the CPU sampler
returns (test-only), so a test can recompute the loss itself on exactly the batch verl trained on.

Loaded in every worker through ``VERL_USE_EXTERNAL_MODULES`` (after :mod:`tests.integrations.verl_cpu_platform`),
with ``KPO_VERL_CAPTURE_DIR`` naming a directory (it may name environment variables: ``{KPO_COMPARE_RUN}/capture``
is the folder of the kpo compare run being trained). It imports kpo's plugin (which registers kpo's losses) and then
wraps every entry of verl's ``POLICY_LOSS_REGISTRY``: the wrapper calls the registered function unchanged and
writes one file per call, ``<dir>/rank<R>-<pid>-<N>.pt`` (R: the worker's torch.distributed rank, N: the call's
number in that process), with:

    loss_mode, loss_agg_mode          what verl asked for
    old_log_prob, log_prob, advantages, response_mask, rollout_is_weights   the tensors verl passed, [B, T]
    global_batch_info                 verl's per-micro-batch global counts (dp_size, batch_num_tokens, ...)
    config                            the actor-config fields the losses read (clip ratios, kpo's q)
    loss, metrics                     what the function returned to verl

and, through :func:`record_sample` (which the hf_cpu server calls), every response the sampler returns to verl,
``<dir>/sample-<pid>-<N>.pt`` with ``token_ids`` and ``log_probs`` (its per-token log-probs, None when verl
did not ask for them): what verl's rollout correction and bypass mode read as ``rollout_log_probs``.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

import kpo.integrations.verl  # noqa: F401  (registers kpo's losses before they are wrapped)

__all__ = ["CAPTURE_DIR_ENV", "CONFIG_FIELDS", "capture_dir", "load_calls", "load_samples", "record_sample"]

CAPTURE_DIR_ENV = "KPO_VERL_CAPTURE_DIR"
CONFIG_FIELDS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "q", "memory")
_calls = itertools.count()
_samples = itertools.count()


def _number(value):
    return value.item() if isinstance(value, torch.Tensor) else value


def _recorded(name: str, fn):
    @functools.wraps(fn)
    def call(**kwargs):
        loss, metrics = fn(**kwargs)
        config = kwargs["config"]
        record = {
            "loss_mode": name,
            "loss_agg_mode": kwargs["loss_agg_mode"],
            **{
                key: None if kwargs.get(key) is None else kwargs[key].detach().clone()
                for key in ("old_log_prob", "log_prob", "advantages", "response_mask", "rollout_is_weights")
            },
            "global_batch_info": {k: _number(v) for k, v in (config.get("global_batch_info") or {}).items()},
            "config": {k: config.get(k, None) for k in CONFIG_FIELDS},
            "loss": loss.detach().clone(),
            "metrics": {k: _number(v) for k, v in metrics.items()},
        }
        rank = os.environ.get("RANK", "0")
        out = capture_dir()
        torch.save(record, out / f"rank{rank}-{os.getpid()}-{next(_calls):04d}.pt")
        return loss, metrics

    return call


def capture_dir() -> Path:
    """``KPO_VERL_CAPTURE_DIR`` with the environment's variables filled in (``{KPO_COMPARE_RUN}/capture``: the folder
    of the kpo compare run this main_ppo trains), created if missing."""
    out = Path(os.environ[CAPTURE_DIR_ENV].format_map(os.environ))
    out.mkdir(parents=True, exist_ok=True)
    return out


def record_sample(token_ids: list[int], log_probs: list[float] | None) -> None:
    """Save one response the sampler returned to verl (a no-op unless ``KPO_VERL_CAPTURE_DIR`` is set)."""
    if os.environ.get(CAPTURE_DIR_ENV):
        out = capture_dir() / f"sample-{os.getpid()}-{next(_samples):05d}.pt"
        torch.save({"token_ids": token_ids, "log_probs": log_probs}, out)


def load_samples(directory: Path) -> list[dict]:
    """Every response :func:`record_sample` saved in ``directory``."""
    return [torch.load(path) for path in sorted(Path(directory).glob("sample-*-*.pt"))]


def load_calls(directory: Path) -> dict[int, list[dict]]:
    """rank -> that rank's recorded calls in call order."""
    calls: dict[int, list[dict]] = {}
    for path in sorted(Path(directory).glob("rank*-*-*.pt")):
        rank = int(path.name.split("-")[0].removeprefix("rank"))
        calls.setdefault(rank, []).append(torch.load(path, weights_only=False))
    return calls


if os.environ.get(CAPTURE_DIR_ENV):
    for _name, _fn in list(POLICY_LOSS_REGISTRY.items()):
        POLICY_LOSS_REGISTRY[_name] = _recorded(_name, _fn)
