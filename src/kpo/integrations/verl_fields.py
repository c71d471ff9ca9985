"""The fields kpo's verl plugin adds to verl's actor config, named without importing verl: the plugin
(:mod:`kpo.integrations.verl`) builds ``KPOActorConfig`` from them, and ``kpo compare --engine verl``
(:mod:`kpo.compare.engines.verl`) owns the same keys, so a loss keyword added to the registry is a field of the
one and a key the other refuses, with no edit to either."""

from __future__ import annotations

import typing
from typing import Any

from kpo.losses import get_loss_spec

__all__ = [
    "DUMP_FIELDS",
    "PLUGIN_FIELDS",
    "STEPS_FIELD",
    "VERL_LOSSES",
    "VERL_OWNED",
    "config_field",
    "loss_field_types",
]

# kpo losses verl 0.9.1 does not have: registered under kpo's name.
VERL_LOSSES = ("kpo", "kpo_unclipped", "aspo", "ctpo", "holder", "vespo", "luspo", "minpro", "cppo")
# Hyperparameters verl's own actor config holds (FSDPActorConfig fields, verl's defaults): read from there.
VERL_OWNED = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")
# kpo hyperparameter -> actor-config field, where the bare name would be ambiguous in verl's actor config.
_CONFIG_FIELD = {"p": "holder_p"}
# Hyperparameters verl's loss call cannot supply (tensors the actor does not pass to the loss, and the entropy
# mask that needs one).
NOT_FROM_CONFIG = frozenset({"token_entropy", "top_entropy_quantile"})
# KPOActorConfig fields that are no loss hyperparameter: the ratio dumps (RatioDumps), and the optimizer steps of
# a generation batch (memory="auto" skips each batch's first, on-policy step).
DUMP_FIELDS = ("dump_ratios_every", "dump_ratios_dir", "dump_ratios_start")
STEPS_FIELD = "steps_per_batch"
PLUGIN_FIELDS = (*DUMP_FIELDS, STEPS_FIELD)


def config_field(hparam: str) -> str:
    """The actor-config field of loss hyperparameter ``hparam``."""
    return _CONFIG_FIELD.get(hparam, hparam)


def loss_field_types(names: tuple[str, ...] = VERL_LOSSES) -> dict[str, list[Any]]:
    """Actor-config field -> the annotations of the hyperparameters it carries, one field per hyperparameter of
    the kpo losses ``names`` (registry order), less those verl's config holds (:data:`VERL_OWNED`) and those its
    loss call cannot supply (:data:`NOT_FROM_CONFIG`)."""
    fields: dict[str, list[Any]] = {}
    for name in names:
        spec = get_loss_spec(name)
        hints = typing.get_type_hints(spec.fn)
        for hparam in spec.hparams:
            if hparam not in NOT_FROM_CONFIG and hparam not in VERL_OWNED:
                fields.setdefault(config_field(hparam), []).append(hints.get(hparam, Any))
    return fields
