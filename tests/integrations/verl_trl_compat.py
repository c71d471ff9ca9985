"""Lets verl 0.9.1's FSDP engine build its model when trl >= 1.0 is installed (test-only).

Whenever trl is importable, verl's ``apply_monkey_patch`` (``verl/models/transformers/monkey_patch.py``, called
by the FSDP engine for every model it builds, actor and reference alike) imports trl's
``AutoModelForCausalLMWithValueHead`` to patch its ``state_dict``. trl 1.x has that class neither at the top level
nor under ``trl.experimental.ppo``, so with trl 1.x installed (kpo's ``train``/``dev`` extras pin trl 1.16)
every verl training run fails at model build with ``ImportError: cannot import name
'AutoModelForCausalLMWithValueHead' from 'trl'``. verl's own ``fsdp`` extra pins trl 0.27, which has it.

The patch only matters for trl's value-head models (a critic built through trl), so this module narrows verl's
``is_trl_available`` inside ``monkey_patch`` to "trl is installed and still has the value-head model": with
trl 1.x that step is skipped, with trl 0.x verl runs it as before. Loaded in every Ray worker through
``VERL_USE_EXTERNAL_MODULES``, like :mod:`tests.integrations.verl_cpu_platform`.
"""

from __future__ import annotations

from verl.models.transformers import monkey_patch

__all__ = ["trl_has_value_head_model"]


def trl_has_value_head_model() -> bool:
    """Whether trl provides ``AutoModelForCausalLMWithValueHead`` where verl looks for it."""
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            return False
    return True


monkey_patch.is_trl_available = trl_has_value_head_model
