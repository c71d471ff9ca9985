"""verl plugin: kpo's policy losses inside stock verl 0.9.1, and an actor config that carries their knobs.

verl loads this module itself: ``import verl`` runs every ``verl.plugins`` entry point, and kpo declares
``kpo = "kpo.integrations.verl"`` (``VERL_USE_EXTERNAL_PLUGINS=none`` turns that off;
``VERL_USE_EXTERNAL_MODULES=kpo.integrations.verl`` imports it explicitly). verl only debug-logs a plugin that
fails to load, so a run that names a kpo loss and fails with "Unsupported loss mode" means this import failed:
``python -c "import kpo.integrations.verl"`` shows why.

On import it registers with ``verl.trainer.ppo.core_algos.register_policy_loss`` every kpo loss that verl lacks
(``VERL_LOSSES``); a name verl already has is never overwritten (``VERL_EQUIVALENTS`` says which verl loss is
the same method). Each registered function takes verl's call

    fn(old_log_prob=, log_prob=, advantages=, response_mask=, loss_agg_mode=, config=, rollout_is_weights=)

and returns exactly ``kpo.policy_loss(name, log_prob=, old_log_prob=, advantages=, response_mask=, ...)``:

- hyperparameters come from the actor config (``KPOActorConfig`` fields, one per keyword of the registered losses,
  plus verl's own ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``); a field left at None
  means the loss's own default.
- ``config.global_batch_info`` (set by verl's ``ppo_loss`` per micro-batch) maps onto kpo's global counts:
  ``batch_num_tokens`` -> ``global_num_tokens``, ``global_batch_size`` -> ``global_num_seqs``, ``dp_size``,
  ``loss_scale_factor``; so micro-batch losses sum to the mini-batch loss, as verl's own losses do.
- ``rollout_is_weights`` multiply the per-token loss (sequence-ratio losses: their per-row geometric mean, as
  verl's geo_mean; VESPO folds them into its sequence weight). A weight of 0 (IcePop) keeps its token in
  ``response_mask``, as verl's losses do; KPO's filter observes it (docs/verl.md says why).
- log-probs may arrive in bfloat16 (verl's v1 trainer passes both so); ``kpo.policy_loss`` computes in float32 at
  least, where verl's own losses compute in the dtype they receive.
- ``loss_agg_mode`` is verl's ``actor.loss_agg_mode``, except for losses whose method fixes it: sequence-level
  losses (``holder``), which, like verl's geo_mean, take a plain mean over sequences whatever the mode, and
  ``luspo`` (seq-mean-token-sum).
- metrics are kpo's under ``actor/`` (``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``,
  ``actor/ratio_mean``, ``actor/filtered_ratio_mean``, ...); ``pg_loss`` is left out because verl's
  ``ppo_loss`` records ``actor/pg_loss`` itself with the right cross-micro-batch aggregation. verl averages
  every returned metric over micro-batches, so ``*_min``/``*_max`` are means of micro-batch extremes.

Select a loss with ``actor_rollout_ref.actor.policy_loss.loss_mode=kpo`` and, to set kpo's knobs,
``actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig`` plus ``+actor_rollout_ref.actor.q=...``
(the ``+`` because verl's composed config does not have the key); examples/verl/README.md has the full map.

With ``dump_ratios_every``/``dump_ratios_dir`` in the actor config, every rank dumps KPO's raw and filtered token
ratios in ``kpo analyze``'s format (:class:`RatioDumps`).

With ``memory="auto"`` the loss of every micro-batch of an optimizer step filters at one q (the fixed-q loss at
it), fitted at the end of the previous step to that whole step's log-ratios, its likelihood's sums all-reduced
over the ranks (:class:`kpo.filter.fit.StepFit`): the same q on every rank and for any micro-batch size or
``use_dynamic_bsz``. verl's loss call does not say where a step ends; the plugin counts each rank's rows
(:class:`_OptimizerSteps`), and verl gives every data-parallel rank the same number of micro-batches, so every
rank reaches the all-reduce in the same call.

It also lets verl's FSDP engine build models when trl 1.x is installed beside it (kpo's ``train`` extra pins
trl 1.16): see :func:`tolerate_trl_1`.

Limitations: verl's loss call carries no token entropy, so ``aspo`` uses its low-entropy clip bounds
(``clip_ratio_low``/``clip_ratio_high``) for every token and TRL's top-entropy mask is not offered; it carries no
rollout log-probs either, so ``luspo``'s ``off_policy_mask_threshold`` measures the drift from
``old_log_prob`` (the sampler's own log-probs in verl's bypass mode).
"""

from __future__ import annotations

import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import field, fields, make_dataclass
from typing import Any

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
from verl.workers.config import FSDPActorConfig

from kpo._distributed import DataParallelSum, mesh_position
from kpo.filter.fit import StepFit
from kpo.integrations.verl_fields import (
    DUMP_FIELDS,
    NOT_FROM_CONFIG,
    PLUGIN_FIELDS,
    STEPS_FIELD,
    VERL_LOSSES,
    VERL_OWNED,
    config_field,
    loss_field_types,
)
from kpo.losses import get_loss_spec, policy_loss
from kpo.losses._core import resolve_clip
from kpo.losses.kpo import PAPER_Q, add_to_fit, filter_settings, fits_memory, fixed_q_kwargs, step_fit

__all__ = [
    "DUMP_FIELDS",
    "GLOBAL_BATCH_INFO_KEYS",
    "KPOActorConfig",
    "REGISTERED",
    "VERL_EQUIVALENTS",
    "VERL_LOSSES",
    "VERL_OWNED",
    "RatioDumps",
    "isolate_transfer_queue",
    "loss_config_fields",
    "loss_hparams",
    "register_with_verl",
    "tolerate_trl_1",
    "trl_has_value_head_model",
    "verl_policy_loss",
]

# kpo loss (or alias) -> the verl 0.9.1 loss that is the same method; kpo leaves verl's in place.
# (verl's "gspo" is the per-token stop-gradient construction, i.e. kpo's gspo_token.)
VERL_EQUIVALENTS = {
    "vanilla": "vanilla",
    "grpo": "vanilla",
    "ppo": "vanilla",
    "gspo": "gspo",
    "gspo_token": "gspo",
    "gmpo": "geo_mean",
    "geo_mean": "geo_mean",
    "sapo": "sapo",
    "cispo": "cispo",
    "dppo_tv": "dppo_tv",
    "dppo_kl": "dppo_kl",
    "clip_cov": "clip_cov",
    "kl_cov": "kl_cov",
    "gpg": "gpg",
    "dro": "dro",
}
# verl global_batch_info key -> kpo.losses keyword (see kpo.losses.aggregation).
GLOBAL_BATCH_INFO_KEYS = {
    "batch_num_tokens": "global_num_tokens",
    "global_batch_size": "global_num_seqs",
    "dp_size": "dp_size",
    "loss_scale_factor": "loss_scale_factor",
}

def loss_hparams(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """Hyperparameters of kpo loss ``name`` read from a verl actor config (dataclass or DictConfig).

    Every hyperparameter the loss accepts is looked up under its actor-config field (``config_field``); fields
    that are absent or None are left out, so the loss uses its own default.
    """
    out = {}
    for hparam in get_loss_spec(name).hparams:
        if hparam in NOT_FROM_CONFIG:
            continue
        value = config.get(config_field(hparam), None)
        if value is not None:
            out[hparam] = value
    return out


def _agg_mode(name: str, loss_agg_mode: str) -> str | None:
    """verl's mode, or None (the loss's own) for a loss whose method fixes its aggregation: a sequence-level
    loss's plain mean over sequences (as verl's geo_mean), LUSPO's sum over tokens (as verl's sapo forces its
    mode)."""
    return None if len(get_loss_spec(name).agg_modes) == 1 else loss_agg_mode


def _global_batch_kwargs(info: Mapping[str, Any] | None) -> dict[str, Any]:
    if not info:
        return {}
    unknown = sorted(set(info) - set(GLOBAL_BATCH_INFO_KEYS))
    if unknown:
        raise ValueError(
            f"config.global_batch_info has keys {unknown} that kpo does not know "
            f"(known: {sorted(GLOBAL_BATCH_INFO_KEYS)}); this verl is newer than the plugin supports"
        )
    return {GLOBAL_BATCH_INFO_KEYS[k]: v for k, v in info.items() if v is not None}


def verl_policy_loss(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    """verl ``PolicyLossFn`` computing kpo loss ``name`` (see the module docstring for the mapping).

    The returned ``fn`` takes verl's keywords: ``old_log_prob``, ``log_prob`` (carries the gradient),
    ``advantages``, ``response_mask`` (bool or 0/1) and ``rollout_is_weights`` (or None), all [B, T];
    ``loss_agg_mode`` (str) and ``config`` (the actor config). Returns (0-dim loss, {"actor/<metric>": float}).
    """
    get_loss_spec(name)  # an unknown name fails here, not at the first training step

    def fn(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Mapping[str, Any] | None = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if config is None:
            raise ValueError(
                f"kpo loss {name!r} reads its hyperparameters from the actor config; pass config="
            )
        kwargs = loss_hparams(name, config)
        fit = _memory_fit(name, kwargs, config) if fits_memory(name, kwargs) else None
        if fit is not None:  # the loss at this optimizer step's q, fixed: the same on every rank and micro-batch
            kwargs = fixed_q_kwargs(kwargs, fit.q)
        kwargs.update(_global_batch_kwargs(config.get("global_batch_info", None)))
        if rollout_is_weights is not None:
            kwargs["rollout_is_weights"] = rollout_is_weights
        loss, metrics = policy_loss(
            name,
            log_prob=log_prob,
            old_log_prob=old_log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=_agg_mode(name, loss_agg_mode),
            **kwargs,
        )
        out = {f"actor/{key}": value for key, value in metrics.items() if key != "pg_loss"}
        dumping = bool(config.get("dump_ratios_every", None))
        if fit is None and not dumping:
            return loss, out
        step = _STEPS.done + 1
        ends = _STEPS.observe(config, log_prob.shape[0], "dump_ratios_every" if dumping else "memory=auto")
        if dumping:
            _DUMPS.observe(step, ends, name, config, log_prob, old_log_prob, response_mask, fit)
        if fit is not None:
            out |= {f"actor/{key}": value for key, value in fit.metrics().items()}
            add_to_fit(fit, log_prob, old_log_prob, response_mask)
            if ends:
                fit.finish()  # every rank, at its mini-batch's last micro-batch: the q of the next step
        return loss, out

    fn.__name__ = fn.__qualname__ = f"kpo_{name}"
    fn.__doc__ = f"kpo loss {name!r} in verl's policy-loss signature (kpo.integrations.verl)."
    fn.kpo_loss = name  # marks kpo's own registrations, so a second registration is a no-op
    return fn


class _OptimizerSteps:
    """This worker's optimizer steps, counted from verl's loss calls, which do not say which step they belong to:
    a rank's micro-batches of one mini-batch (one optimizer step) hold ``global_batch_size / dp_size`` rows
    together (``config.global_batch_info``, set by verl's v1 trainer), whatever the micro-batch size or
    ``use_dynamic_bsz`` (verl gives every data-parallel rank the same number of micro-batches)."""

    def __init__(self):
        self.done = 0  # optimizer steps this rank finished
        self.rows = 0  # rows of the current mini-batch seen so far

    def observe(self, config, rows: int, setting: str) -> bool:
        """Count one loss call of ``rows`` rows; whether it ends an optimizer step (``setting``: what needs it)."""
        info = config.get("global_batch_info", None) or {}
        if not info.get("global_batch_size"):
            raise ValueError(
                f"actor_rollout_ref.actor.{setting}: kpo counts optimizer steps from verl's global_batch_info, "
                "which only the v1 trainer sets: use trainer.use_v1=True or drop it"
            )
        self.rows += rows
        if self.rows < info["global_batch_size"] // info["dp_size"]:
            return False  # more micro-batches of this mini-batch to come
        self.done, self.rows = self.done + 1, 0
        return True


_STEPS = _OptimizerSteps()  # one per worker process: its rank's steps
_FITS: dict[str, StepFit] = {}  # memory="auto": one StepFit per loss and settings in this worker


def _memory_fit(name: str, hparams: dict, config) -> StepFit:
    """This worker's :class:`~kpo.filter.fit.StepFit` of loss ``name`` with ``hparams`` (:func:`loss_hparams`,
    ``memory="auto"``): until a step identifies q it filters at the variant's paper q (verl's actor config does
    not carry the response length that kpo train's matched memory needs); each generation batch's first step
    (``steps_per_batch``, a field the config check requires with memory="auto") is not fitted; the likelihood's
    sums are added over the data-parallel group (the ranks of a sequence-parallel group hold the same rows)."""
    key = f"{name}:{sorted((k, repr(v)) for k, v in hparams.items())}"
    if key not in _FITS:
        info = config.get("global_batch_info", None) or {}
        _FITS[key] = step_fit(
            name,
            hparams,
            PAPER_Q[name],
            steps_per_batch=config.get(STEPS_FIELD),
            reduce=DataParallelSum(int(info.get("dp_size") or 1)),
        )
    return _FITS[key]


class RatioDumps:
    """This worker's ratio dumps (``kpo analyze``'s format, :func:`kpo.analysis.dumps.write_dump`): every
    ``dump_ratios_every``-th optimizer step of this rank (:class:`_OptimizerSteps`), its raw token log-ratios
    (log pi_theta - log pi_old, as the loss received them) and their Kalman filter at the loss's settings (with
    ``memory="auto"``, the q the step's losses used), as
    ``<dump_ratios_dir>/step_{step:06d}-rank{R}.safetensors``, R its data-parallel rank (one file per
    sequence-parallel group, whose ranks hold the same rows). ``dump_ratios_start`` is the count a resumed
    run starts from. ``on_policy`` is left unknown: ``kpo analyze --off-policy-only`` then leaves out the rows
    whose log-ratios are all exactly 0 (the first mini-batch of a batch in verl's default, decoupled mode).
    """

    def __init__(self):
        self.parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # (log-ratio, mask) [B_i, T_i] of a dumped step

    def observe(self, steps: int, ends: bool, name: str, config, log_prob, old_log_prob, response_mask, fit) -> None:
        """One loss call of this rank's optimizer step ``steps`` (counted in this process), the last of its step
        where ``ends``; ``fit``: the StepFit whose q the losses use, or None."""
        from pathlib import Path

        from kpo.analysis.dumps import write_dump

        step = int(config.get("dump_ratios_start", None) or 0) + steps
        info = config.get("global_batch_info", None) or {}
        dp_rank, sp_rank = mesh_position(int(info.get("dp_size") or 1))
        if sp_rank:  # the ranks of a sequence-parallel group hold the same rows: its first writes them
            return
        if step % int(config.get("dump_ratios_every")) == 0:
            self.parts.append((log_prob.detach().float() - old_log_prob.detach().float(), response_mask.detach()))
        if not ends:
            return
        parts, self.parts = self.parts, []
        if not parts:
            return
        width = max(z.shape[1] for z, _ in parts)  # v1 pads each micro-batch to its own longest response
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        mask = torch.cat([pad(m.to(torch.uint8)) for _, m in parts]).cpu()
        log_ratio = torch.cat([pad(z) for z, _ in parts]).cpu() * mask
        write_dump(
            Path(config.get("dump_ratios_dir")) / f"step_{step:06d}-rank{dp_rank}.safetensors",
            log_ratio,
            mask,
            step=step,
            settings=filter_settings(name, loss_hparams(name, config), fitted_q=None if fit is None else fit.q),
            loss=name,
            source=f"verl data-parallel rank {dp_rank}",
        )


_DUMPS = RatioDumps()  # one per worker process: its rank's dumps


def register_with_verl(names: tuple[str, ...] = VERL_LOSSES) -> tuple[str, ...]:
    """Register kpo losses ``names`` in verl's policy-loss registry; returns the names this call added.

    A name verl already has (a future verl may add one) is left alone, with a warning: overwriting it would
    silently change what an existing verl config computes.
    """
    added = []
    for name in names:
        current = POLICY_LOSS_REGISTRY.get(name)
        if current is None:
            register_policy_loss(name)(verl_policy_loss(name))
            added.append(name)
        elif getattr(current, "kpo_loss", None) != name:
            warnings.warn(
                f"verl already registers a policy loss {name!r}; kpo leaves verl's in place, so "
                f"loss_mode={name} runs verl's implementation, not kpo's",
                stacklevel=2,
            )
    return tuple(added)


def _field_type(annotations: list[Any]) -> Any:
    """The type of an actor-config field whose losses annotate it ``annotations``: ``T | None`` where each is
    ``T`` or ``T | None`` for one plain type T (what OmegaConf types), else ``Any`` (memory's
    ``float | str | None``, or losses that disagree)."""
    plain = set()
    for annotation in annotations:
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        plain |= set(typing.get_args(annotation)) - {type(None)} if union else {annotation}
    kind = plain.pop() if len(plain) == 1 else None
    return kind | None if kind in (bool, int, float, str) else Any


def loss_config_fields(names: tuple[str, ...] = VERL_LOSSES) -> list[tuple[str, Any, Any]]:
    """``KPOActorConfig``'s loss fields, read from the loss registry
    (:func:`kpo.integrations.verl_fields.loss_field_types`): one per hyperparameter of the kpo losses ``names``,
    typed from the losses' annotations and defaulting to None (= the loss's own default).

    A hyperparameter whose field name is also a field of verl's actor config (other than ``VERL_OWNED``) is a
    TypeError: verl's value would silently reach the loss; give it another field name in
    ``kpo.integrations.verl_fields._CONFIG_FIELD``.
    """
    annotations = loss_field_types(names)
    taken = sorted(set(annotations) & {f.name for f in fields(FSDPActorConfig)})
    if taken:
        raise TypeError(
            f"kpo loss hyperparameters {taken} are named like fields of verl's actor config; map them to other "
            "field names in kpo.integrations.verl_fields._CONFIG_FIELD"
        )
    return [(key, _field_type(types_), field(default=None)) for key, types_ in annotations.items()]


def _post_init(self) -> None:
    """verl's checks, then kpo's: the ratio-dump fields, the loss fields the selected loss uses, and their values
    through the loss's own checks, on the driver, before Ray starts."""
    FSDPActorConfig.__post_init__(self)
    loss_mode = self.policy_loss.get("loss_mode", "vanilla")
    _check_dumps(self, loss_mode)
    _check_steps(self, loss_mode)
    own = {f.name for f in fields(self)} - {f.name for f in fields(FSDPActorConfig)} - set(PLUGIN_FIELDS)
    set_fields = sorted(k for k in own if getattr(self, k) is not None)
    if loss_mode not in VERL_LOSSES:
        if set_fields:
            raise ValueError(
                f"actor_rollout_ref.actor: {', '.join(set_fields)} are kpo loss settings but "
                f"policy_loss.loss_mode={loss_mode!r} is verl's own loss, which ignores them; pick one of "
                f"{', '.join(VERL_LOSSES)} or drop them"
            )
        return
    accepted = {config_field(h) for h in get_loss_spec(loss_mode).hparams} & own
    unused = [k for k in set_fields if k not in accepted]
    if unused:
        raise ValueError(
            f"actor_rollout_ref.actor: loss_mode={loss_mode!r} does not use {', '.join(unused)}; "
            f"its kpo settings are {', '.join(sorted(accepted)) or '(none)'}"
        )
    # The loss's own checks, on a one-token batch, so a bad value fails at config time, not in a worker.
    one = torch.zeros(1, 1, dtype=torch.float64)
    try:
        policy_loss(
            loss_mode,
            log_prob=one,
            old_log_prob=one,
            advantages=one[:, 0],
            response_mask=torch.ones(1, 1, dtype=torch.bool),
            loss_agg_mode=_agg_mode(loss_mode, self.loss_agg_mode),
            **loss_hparams(loss_mode, self),
        )
    except (TypeError, ValueError) as err:
        raise ValueError(f"actor_rollout_ref.actor (loss_mode={loss_mode!r}): {err}") from err
    hp = loss_hparams(loss_mode, self)
    clip = resolve_clip(hp.get("clip_ratio"), hp.get("clip_ratio_low"), hp.get("clip_ratio_high"), 3e-4, 4e-4)
    if loss_mode == "kpo" and clip == (0.2, 0.2):
        # verl's PPO defaults are 700x wider than KPO's: with them the filtered ratio is almost never clipped
        warnings.warn(
            "actor_rollout_ref.actor: loss_mode='kpo' runs with clip_ratio_low/high = 0.2/0.2, verl's PPO "
            "defaults; the paper's KPO uses 3e-4/4e-4 (set actor_rollout_ref.actor.clip_ratio_low=3e-4 "
            "and clip_ratio_high=4e-4, or keep 0.2 on purpose)",
            stacklevel=2,
        )


def _check_dumps(config, loss_mode: str) -> None:
    """The ratio-dump fields: a period >= 1 with a folder, for one of kpo's losses (verl's own losses do not run
    kpo's code, so nothing would be dumped)."""
    given = [k for k in DUMP_FIELDS if getattr(config, k) is not None]
    if not given:
        return
    where = "actor_rollout_ref.actor"
    if loss_mode not in VERL_LOSSES:
        raise ValueError(
            f"{where}: {', '.join(given)} dump kpo's loss inputs, but policy_loss.loss_mode={loss_mode!r} is "
            f"verl's own loss; use one of {', '.join(VERL_LOSSES)} or drop them"
        )
    every, start = config.dump_ratios_every, config.dump_ratios_start
    if not isinstance(every, int) or isinstance(every, bool) or every < 1 or not config.dump_ratios_dir:
        raise ValueError(
            f"{where}: set dump_ratios_every to an integer >= 1 (optimizer steps) and dump_ratios_dir to a "
            f"folder, together (got {every!r} and {config.dump_ratios_dir!r})"
        )
    if start is not None and (not isinstance(start, int) or isinstance(start, bool) or start < 0):
        raise ValueError(f"{where}: dump_ratios_start={start!r}: give the optimizer steps done, an integer >= 0")


def _check_steps(config, loss_mode: str) -> None:
    """``steps_per_batch``: an integer >= 1 where given, and given with ``memory="auto"`` (whose fit skips each
    generation batch's first step: :class:`kpo.filter.fit.StepFit`)."""
    where, steps = f"actor_rollout_ref.actor.{STEPS_FIELD}", getattr(config, STEPS_FIELD)
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"{where}={steps!r}: give the optimizer steps of a generation batch, an integer >= 1")
    if steps is None and loss_mode in VERL_LOSSES and getattr(config, "memory", None) == "auto":
        raise ValueError(
            f"actor_rollout_ref.actor.memory=auto fits q on the off-policy steps only: set +{where} to the optimizer "
            "steps of a generation batch, data.train_batch_size / ppo_mini_batch_size x ppo_epochs (its first "
            "step, on-policy, is not fitted; kpo compare sets it)"
        )


_ACTOR_DOC = """verl's FSDP actor config plus the hyperparameters of kpo's losses.

Select it with ``actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig`` and set a field with
``+actor_rollout_ref.actor.<field>=<value>``. Its loss fields are built from the loss registry
(:func:`loss_config_fields`): every keyword of every loss in ``VERL_LOSSES`` is a field under the keyword's own
name (HolderPO's ``p`` is ``holder_p``), so a keyword added to a loss is a field here with no edit to this
module. What each means, and its paper default: the loss function's docstring (``get_loss_spec(name).fn``) and
docs/methods.md. Every field defaults to None = the chosen loss's own default. The clip ranges are verl's own
``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c`` (``VERL_OWNED``; verl defaults them to
0.2/0.2/3.0, so set them for KPO: 3e-4/4e-4). Fields are validated up front, on the driver, by the same checks
the loss runs: a field the selected ``policy_loss.loss_mode`` does not use is an error.

In verl: KPO's ``memory="auto"`` fits one q per optimizer step over every micro-batch and rank (the module
docstring); ASPO's high-entropy clip range and ``entropy_quantile`` have no effect (verl passes no token entropy
to the loss, so every token uses ``clip_ratio_low``/``clip_ratio_high``); LUSPO's ``off_policy_mask_threshold``
measures the drift from ``old_log_prob``.

Ratio dumps (any of kpo's losses; :class:`RatioDumps`, read by ``kpo analyze``): ``dump_ratios_every`` (every N
optimizer steps each rank writes the step's raw and filtered token ratios), ``dump_ratios_dir`` (the folder,
``step_{N:06d}-rank{R}.safetensors``), ``dump_ratios_start`` (optimizer steps done before this process started,
a resumed run's; 0 by default).

``steps_per_batch``: the optimizer steps of a generation batch (``data.train_batch_size / ppo_mini_batch_size x
ppo_epochs``), needed by ``memory="auto"``, whose fit skips each batch's first, on-policy step.
"""

KPOActorConfig = make_dataclass(
    "KPOActorConfig",
    [
        *loss_config_fields(),
        ("dump_ratios_every", int | None, field(default=None)),
        ("dump_ratios_dir", str | None, field(default=None)),
        ("dump_ratios_start", int | None, field(default=None)),
        (STEPS_FIELD, int | None, field(default=None)),
    ],
    bases=(FSDPActorConfig,),
    namespace={"__post_init__": _post_init, "__doc__": _ACTOR_DOC, "__module__": __name__},
)


def trl_has_value_head_model() -> bool:
    """Whether trl provides ``AutoModelForCausalLMWithValueHead`` where verl 0.9.1 looks for it."""
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            return False
    return True


def tolerate_trl_1() -> None:
    """Narrow verl's "is trl installed" check in its model patching to "trl still has the value-head model".

    Whenever trl is importable, verl 0.9.1's ``apply_monkey_patch`` (run by the FSDP engine for every model it
    builds) imports trl's ``AutoModelForCausalLMWithValueHead`` to patch its ``state_dict``. trl 1.x has that class
    neither at the top level nor under ``trl.experimental.ppo``, so with trl 1.x beside verl every training run
    failed at model build (``ImportError: cannot import name 'AutoModelForCausalLMWithValueHead' from 'trl'``).
    The patch only matters for trl's value-head models, so with trl 1.x the step is skipped; with trl 0.x
    (verl's ``fsdp`` extra pins 0.27) verl runs it as before.
    """
    from verl.models.transformers import monkey_patch

    monkey_patch.is_trl_available = trl_has_value_head_model


TQ_NAMESPACE = "transfer_queue"  # the Ray namespace TransferQueue 0.1.11 names its actors in, cluster-wide


def _job_namespace(namespace: str | None) -> str | None:
    """TransferQueue's namespace made this Ray job's own; any other namespace as it is."""
    import ray

    if namespace != TQ_NAMESPACE:
        return namespace
    return f"{TQ_NAMESPACE}-{ray.get_runtime_context().get_job_id()}"


class _JobScopedRay:
    """``ray`` as TransferQueue's modules see it, with :func:`_job_namespace` applied to ``get_actor``."""

    def __getattr__(self, name: str):
        import ray

        return getattr(ray, name)

    @staticmethod
    def get_actor(name: str, namespace: str | None = None):
        import ray

        return ray.get_actor(name, namespace=_job_namespace(namespace))


class _JobScopedActor:
    """A Ray actor class whose ``options(namespace=...)`` go through :func:`_job_namespace`."""

    def __init__(self, actor_class):
        self._actor_class = actor_class

    def __getattr__(self, name: str):
        return getattr(self._actor_class, name)

    def options(self, **options):
        if "namespace" in options:
            options["namespace"] = _job_namespace(options["namespace"])
        return self._actor_class.options(**options)


def isolate_transfer_queue() -> None:
    """Give each Ray job its own TransferQueue.

    verl's v1 trainer keeps its batches in TransferQueue, whose controller is a named Ray actor in the fixed
    namespace "transfer_queue", so one per cluster: a second run on the same cluster (``kpo compare --jobs 2`` on a
    Ray cluster, or two ``ray job submit`` of main_ppo) connects to the first run's controller, and hangs when that
    run ends (reproduced with TransferQueue 0.1.11 on a local cluster). TransferQueue's modules look the controller
    up through their own ``ray`` and actor classes; those references are pointed at wrappers that make the
    namespace ``transfer_queue-<job id>``, the same in every process of one job. Nothing else of Ray changes.
    """
    try:
        from transfer_queue import interface
        from transfer_queue.storage.clients import ray_storage_client
    except ImportError:  # no TransferQueue: verl's legacy trainer only
        return
    for module in (interface, ray_storage_client):
        if not isinstance(module.ray, _JobScopedRay):
            module.ray = _JobScopedRay()
    for module, name in ((interface, "TransferQueueController"), (ray_storage_client, "RayObjectRefStorage")):
        actor = getattr(module, name, None)
        if actor is not None and not isinstance(actor, _JobScopedActor):
            setattr(module, name, _JobScopedActor(actor))


REGISTERED = register_with_verl()
tolerate_trl_1()
isolate_transfer_queue()
