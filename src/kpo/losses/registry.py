"""The registry of policy losses: ``register_loss`` (the decorator every loss module applies), ``get_loss_spec``
and ``list_losses``. Loss modules import it, never the package ``__init__``, which imports them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from kpo.losses._core import LossTerms
from kpo.losses.aggregation import GLOBAL_BATCH_KEYS, TOKEN_AGG_MODES
from kpo.losses.mismatch import MISMATCH_KEYS

IS_WEIGHT_USES = ("token", "seq_geo_mean", "consumed")
SHARED_KEYS = (*GLOBAL_BATCH_KEYS, *MISMATCH_KEYS, "rollout_is_weights")


@dataclass(frozen=True)
class LossSpec:
    name: str
    fn: Callable[..., LossTerms]
    default_agg: str
    agg_modes: tuple[str, ...]
    is_weights: str
    hparams: dict[str, object]  # accepted keyword -> default


_REGISTRY: dict[str, LossSpec] = {}
_ALIASES: dict[str, str] = {}


def register_loss(
    name: str,
    *,
    aliases: tuple[str, ...] = (),
    default_agg: str = "token-mean",
    agg_modes: tuple[str, ...] = TOKEN_AGG_MODES,
    is_weights: str = "token",
):
    """Decorator registering ``fn(batch, *, hparams...) -> LossTerms`` under ``name`` (and ``aliases``).

    ``agg_modes`` lists the aggregations the loss allows (a sequence-level loss: ``("seq-mean",)``; a loss whose
    method fixes one, e.g. SAPO: that one); ``is_weights`` says how rollout IS weights enter (``IS_WEIGHT_USES``).
    A name or alias already taken is an error.
    """
    if default_agg not in agg_modes:
        raise ValueError(f"default_agg {default_agg!r} of loss {name!r} is not in its agg_modes {agg_modes}")
    if is_weights not in IS_WEIGHT_USES:
        raise ValueError(f"is_weights must be one of {IS_WEIGHT_USES}, got {is_weights!r}")

    def decorator(fn: Callable[..., LossTerms]) -> Callable[..., LossTerms]:
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"policy loss {key!r} is already registered; pick another name")
        params = list(inspect.signature(fn).parameters.values())
        hparams = {}
        for p in params[1:]:
            if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
                raise TypeError(
                    f"loss {name!r}: hyperparameter {p.name!r} must be keyword-only with a default"
                )
            if p.name in SHARED_KEYS:
                raise TypeError(f"loss {name!r}: {p.name!r} is a keyword shared by all losses")
            hparams[p.name] = p.default
        _REGISTRY[name] = LossSpec(name, fn, default_agg, tuple(agg_modes), is_weights, hparams)
        for alias in aliases:
            _ALIASES[alias] = name
        return fn

    return decorator


def list_losses() -> list[str]:
    """Registered loss names and aliases, sorted."""
    return sorted([*_REGISTRY, *_ALIASES])


def get_loss_spec(name: str) -> LossSpec:
    """The spec (function, defaults, aggregations) behind a name or alias."""
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        raise ValueError(f"unknown policy loss {name!r}; valid names: {', '.join(list_losses())}")
    return _REGISTRY[key]
