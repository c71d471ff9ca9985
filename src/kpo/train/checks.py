"""The checks of a ``kpo train`` config: every problem found at once, each with its fix.

:func:`config_errors` is what :meth:`kpo.train.config.TrainConfig.validate` reports, and :func:`settings_errors`
(kpo's own settings alone, :class:`~kpo.train.settings.KPOSettings`) what the API's ``KPOConfig`` reports. The
tables below say what each check holds a field to: its bounds (:data:`_BOUNDS`), the fields of the train-inference
mismatch, and the settings that act only with another one (:data:`_IGNORED_UNLESS`: given where they would be
ignored, they are refused). The checks reach into the parts a field names (the loss registry, the advantage
estimators, the sampler, the embedded task and its warm start, the dataset loader), each run once on a small input.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import typing
from pathlib import Path
from typing import Any

from kpo._checks import file_in_the_way, no_tokenizer, unwritable

__all__ = ["WARM_START_FIELDS", "config_errors", "field_kinds", "loss_errors", "settings_errors"]

# Numeric fields' bounds, name -> (low, high or None, why); a None value (where the type allows it) passes.
_POSITIVE = (
    "learning_rate",
    "temperature",
    "sft_learning_rate",
    "max_grad_norm",
    "vllm_importance_sampling_clip_max",
    "rollout_is_threshold",
)  # low is exclusive
_BOUNDS = {
    **dict.fromkeys(
        (
            "max_steps",
            "prompts_per_step",
            "minibatches",
            "tiny_hidden_size",
            "tiny_layers",
            "tiny_heads",
            "sft_examples",
            "sft_epochs",
            "save_total_limit",
            "micro_batch_size",
            "max_completion_length",
            "num_threads",
        ),
        (1, None, ""),
    ),
    "num_generations": (2, None, " (a GRPO group compares at least 2 responses per prompt)"),
    **dict.fromkeys(("save_steps", "dump_ratios_every", "rollout_lag"), (0, None, " (0 = off)")),
    "weight_decay": (0, None, ""),
    "seed": (0, 2**32 - 1, " (numpy's seed range)"),
    "warm_start_seed": (0, 2**32 - 1, " (numpy's seed range)"),
    "n_terms": (1, None, ""),
    "max_value": (1, None, ""),
    "sft_noise": (0, 1, " (a probability)"),
    "vllm_gpu_memory_utilization": (0, 1, " (a share of GPU memory)"),
    **dict.fromkeys(_POSITIVE, (0, None, "")),
}
_MISMATCH_FIELDS = (
    "rollout_dtype",
    "rollout_lag",
    "ratio_anchor",
    "rollout_is",
    "rollout_is_threshold",
    "rollout_rs",
    "rollout_rs_threshold",
    "rollout_rs_threshold_lower",
    "use_vllm",
)
# Settings that act only with another one: name -> (when it is ignored, the fix that makes it act, whether a config
# has what it needs). Given (not at its default) where it would be ignored, it is refused.
_WITH_VLLM = ("without --use-vllm", "add --use-vllm", lambda c: c.use_vllm)
_WITH_DATASET = ("without --dataset (it reads dataset rows)", "add --dataset FILE", lambda c: c.dataset is not None)
# The embedded model's warm start: its seed, shape, SFT round and cache (kpo task takes them; --model replaces them)
WARM_START_FIELDS = (
    "warm_start_seed",
    "cache_dir",
    "tiny_hidden_size",
    "tiny_layers",
    "tiny_heads",
    "sft_examples",
    "sft_epochs",
    "sft_noise",
    "sft_learning_rate",
)
_IGNORED_UNLESS: dict[str, tuple[str, str, typing.Callable[[Any], bool]]] = {
    "rollout_is_threshold": (
        "without --rollout-is (no TIS weight to truncate)",
        "add --rollout-is token (or sequence)",
        lambda c: c.rollout_is is not None,
    ),
    **dict.fromkeys(
        ("rollout_rs_threshold", "rollout_rs_threshold_lower"),
        (
            "without --rollout-rs (no token is rejected)",
            "add --rollout-rs token (or sequence, or verl's options)",
            lambda c: c.rollout_rs is not None,
        ),
    ),
    **dict.fromkeys(
        ("vllm_gpu_memory_utilization", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max"),
        _WITH_VLLM,
    ),
    **dict.fromkeys(("problem_key", "answer_key", "instruction"), _WITH_DATASET),
    **dict.fromkeys(
        ("task", "n_terms", "max_value"),
        ("with --dataset (it sets the embedded task)", "drop --dataset", lambda c: c.dataset is None),
    ),
    **dict.fromkeys(
        WARM_START_FIELDS,
        ("with --model (it sets the embedded model and its warm start)", "drop --model", lambda c: c.model is None),
    ),
}
_VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_TYPE_NAMES = {
    bool: "true/false",
    int: "an integer",
    float: "a finite number",
    str: "a string",
    dict: "a mapping",
    type(None): "none",
}


def config_errors(config, *, world_size: int = 1) -> list[str]:
    """Every problem of ``config`` (a :class:`~kpo.train.config.TrainConfig`) for a run on ``world_size``
    processes, each a line that names the field first and says how to fix it; empty when there is none.

    A field of the wrong type or out of range gets one error, and the checks that combine it with other
    fields are skipped (their message would be about a value that is already reported)."""
    bad = _type_errors(config)
    bad |= _range_errors(config, skip=bad)
    errors = list(bad.values())

    def ok(*names: str) -> bool:
        return not bad.keys() & set(names)

    if ok(
        "prompts_per_step",
        "num_generations",
        "minibatches",
        "max_steps",
        "save_steps",
        "micro_batch_size",
    ):
        errors += _batch_errors(config, world_size)
    if ok("tiny_hidden_size", "tiny_heads") and config.tiny_hidden_size % config.tiny_heads:
        errors.append(
            f"tiny_hidden_size={config.tiny_hidden_size} must be divisible by tiny_heads={config.tiny_heads}"
        )
    errors += _settings_checks(config, ok)
    if ok("rollout_lag", "max_steps", "minibatches"):
        errors += _lag_errors(config)
    errors += _ignored_errors(config, skip=bad)
    if ok("model") and config.model is not None:
        errors += _model_errors(config)
    elif ok("model", "task", "n_terms", "max_value", "seed", "sft_examples", "prompts_per_step"):
        errors += _task_errors(config)
    if ok("dataset", "model", "problem_key", "answer_key") and config.dataset is not None:
        errors += _dataset_errors(config)
    if ok("use_vllm") and config.use_vllm:
        errors += _vllm_errors(config)
    if ok("bf16") and config.bf16:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
            errors.append("bf16=True needs a CUDA device with bfloat16; leave bf16 unset on CPU")
    if ok("report_to"):
        errors += _report_to_errors(config.report_to)
    if ok("output_dir", "resume", "overwrite"):
        errors += _output_dir_errors(config)
    return errors


def settings_errors(config) -> list[str]:
    """Every problem of kpo's settings (:class:`~kpo.train.settings.KPOSettings`) of ``config`` (the API's
    ``KPOConfig``), each a line that names the field first and says how to fix it: their types and ranges, the
    loss's dry run, the advantage estimator, the sampler and its correction, and a threshold given without the
    correction it bounds."""
    from kpo.train.settings import KPOSettings

    names = [f.name for f in dataclasses.fields(KPOSettings)]
    bad = _type_errors(config, KPOSettings)
    bad |= _range_errors(config, skip=bad, names=names)

    def ok(*fields: str) -> bool:
        return not bad.keys() & set(fields)

    return [*bad.values(), *_settings_checks(config, ok), *_ignored_errors(config, skip=bad, names=names)]


def _settings_checks(config, ok: typing.Callable[..., bool]) -> list[str]:
    """The checks of kpo's settings that combine fields, each where ``ok`` finds its fields well typed and in range:
    the loss's dry run, the advantage estimator, the sampler and its correction."""
    errors = []
    if ok("loss", "loss_kwargs", "loss_agg_mode"):
        errors += loss_errors(config)
    if ok("advantage"):
        errors += _advantage_errors(config)
    if ok(*_MISMATCH_FIELDS):
        errors += _mismatch_errors(config)
    return errors


def _type_errors(config, cls: type | None = None) -> dict[str, str]:
    """{field: error} for every field of dataclass ``cls`` (default: the config's own) whose value in ``config``
    does not match its annotation there (ints pass as floats)."""
    errors = {}
    for f in dataclasses.fields(cls or config):
        kinds = field_kinds(cls or type(config), f.name)
        value = getattr(config, f.name)
        if not any(_has_type(value, kind) for kind in kinds):
            expected = " or ".join(_TYPE_NAMES[kind] for kind in kinds)
            errors[f.name] = f"{f.name}={value!r}: expected {expected}, got {type(value).__name__}"
    return errors


def _range_errors(config, skip: dict[str, str], names: list[str] | None = None) -> dict[str, str]:
    """{field: error} for numbers outside :data:`_BOUNDS` (only ``names`` where given; fields in ``skip`` and None
    values pass)."""
    errors = {}
    for name, (low, high, why) in _BOUNDS.items():
        if names is not None and name not in names:
            continue
        value = getattr(config, name)
        if name in skip or value is None:
            continue
        if name in _POSITIVE and value <= low:
            errors[name] = f"{name}={value!r}: must be > {low}{why}"
        elif value < low or (high is not None and value > high):
            limit = f"in [{low}, {high}]" if high is not None else f">= {low}"
            errors[name] = f"{name}={value!r}: must be {limit}{why}"
    return errors


def _batch_errors(config, world_size: int) -> list[str]:
    errors = []
    if config.generation_batch % config.minibatches:
        errors.append(
            f"prompts_per_step x num_generations = {config.generation_batch} is not divisible by "
            f"minibatches={config.minibatches}: pick minibatches dividing {config.generation_batch}"
        )
    elif config.mini_batch % world_size:
        errors.append(
            f"mini-batch of {config.mini_batch} sequences does not split over {world_size} devices: "
            "change prompts_per_step or minibatches"
        )
    elif config.micro_batch_size is not None and (config.mini_batch // world_size) % config.micro_batch_size:
        errors.append(
            f"micro_batch_size={config.micro_batch_size} must divide the per-device mini-batch of "
            f"{config.mini_batch // world_size} sequences"
        )
    # A checkpoint inside a generation batch cannot resume it: the rest of the batch is not saved.
    # The last checkpoint is written at max_steps, so max_steps must end a generation batch too.
    for name in ("max_steps", "save_steps"):
        value = getattr(config, name)
        if value > 0 and value % config.minibatches:
            errors.append(
                f"{name}={value} must be a multiple of minibatches={config.minibatches} (a checkpoint "
                "inside a generation batch could not resume to the same trajectory): use "
                f"{name}={_round_up(value, config.minibatches)} or another multiple"
            )
    return errors


def _vllm_errors(config) -> list[str]:
    import torch

    errors = []
    if importlib.util.find_spec("vllm") is None:
        errors.append("use_vllm=True but vllm is not installed: pip install vllm, or drop --use-vllm")
    if not torch.cuda.is_available():
        errors.append(
            "use_vllm=True needs a CUDA GPU (vLLM generates on it); drop --use-vllm on this machine"
        )
    if config.vllm_importance_sampling_mode not in _VLLM_IS_MODES:
        errors.append(
            f"vllm_importance_sampling_mode={config.vllm_importance_sampling_mode!r}: must be one of "
            f"{', '.join(_VLLM_IS_MODES)}"
        )
    return errors


def _mismatch_errors(config) -> list[str]:
    """The sampler's settings: known names, and a rollout correction that the loss accepts."""
    import torch

    from kpo.losses.mismatch import rollout_correction
    from kpo.train.sampler import RATIO_ANCHORS, ROLLOUT_DTYPES

    errors = []
    if config.rollout_dtype not in ROLLOUT_DTYPES:
        errors.append(f"rollout_dtype={config.rollout_dtype!r}: use one of {', '.join(ROLLOUT_DTYPES)}")
    if config.ratio_anchor not in RATIO_ANCHORS:
        errors.append(f"ratio_anchor={config.ratio_anchor!r}: use one of {', '.join(RATIO_ANCHORS)}")
    if config.ratio_anchor == "rollout" and config.rollout_is is not None:
        errors.append(
            f"rollout_is={config.rollout_is!r} with ratio_anchor=rollout: the PPO ratio pi_theta / pi_sampler "
            "already corrects the mismatch (verl's bypass mode applies no TIS weight with PPO-clip); drop "
            "--rollout-is, or use --ratio-anchor trainer"
        )
    sampler_set = (
        config.rollout_dtype != "float32"
        or config.rollout_lag
        or config.ratio_anchor != "trainer"
        or config.rollout_correction()
    )
    if config.use_vllm and sampler_set:
        errors.append(
            "rollout_dtype, rollout_lag, ratio_anchor and rollout_is/rollout_rs set kpo's CPU sampler; with --use-vllm, TRL's "
            "--vllm-importance-sampling-mode corrects the mismatch: leave them at their defaults"
        )
    if not errors and config.rollout_correction():
        lp = torch.zeros(1, 2)  # the correction checks its own settings
        try:
            rollout_correction(lp, lp, torch.ones(1, 2, dtype=torch.bool), **config.rollout_correction())
        except ValueError as e:
            errors.append(f"rollout correction: {e}")
    return errors


def _lag_errors(config) -> list[str]:
    """A lag that no generation batch of the run reaches (the sampler would keep the starting weights)."""
    batches = config.max_steps // config.minibatches
    if not config.rollout_lag or config.rollout_lag < batches:
        return []
    return [
        f"rollout_lag={config.rollout_lag}: the run has {batches} generation batch(es) (max_steps={config.max_steps} "
        f"/ minibatches={config.minibatches}), so none would be sampled {config.rollout_lag} batches behind the "
        f"trainer: the sampler would keep the starting weights all run; use --rollout-lag {batches - 1} or less "
        f"(0 = none), or --max-steps {(config.rollout_lag + 1) * config.minibatches} or more"
    ]


def _ignored_errors(config, skip: dict[str, str], names: list[str] | None = None) -> list[str]:
    """Settings given (not at their default) that the run would ignore, as :data:`_IGNORED_UNLESS` says (only
    ``names`` where given)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    errors = []
    for name, (why, fix, acts) in _IGNORED_UNLESS.items():
        if names is not None and name not in names:
            continue
        value = getattr(config, name)
        if name not in skip and value != defaults[name] and not acts(config):
            flag = f"--{name.replace('_', '-')}"
            errors.append(f"{name}={value!r} is ignored {why}: drop {flag}, or {fix}")
    return errors


def _advantage_errors(config) -> list[str]:
    import torch

    from kpo.advantages import compute_advantages

    try:
        compute_advantages(config.advantage, torch.tensor([0.0, 1.0]), [0, 0])
    except (ValueError, TypeError) as e:
        return [f"advantage={config.advantage!r}: {e}"]
    return []


def _task_errors(config) -> list[str]:
    """The synthetic task can supply the warm start's problems and a generation batch of distinct prompts."""
    try:
        task = config.task_config()
    except ValueError as e:
        return [f"task/n_terms/max_value: {e}"]
    n_sft = config.sft_settings().n_examples
    return list(_task_check(task, config.seed, config.resolved_warm_start_seed(), n_sft, config.prompts_per_step))


def _model_errors(config) -> list[str]:
    if not (Path(config.model) / "config.json").exists():
        return [f"model={config.model!r}: no config.json there; give a Hugging Face checkpoint directory"]
    missing = no_tokenizer(Path(config.model))
    return [] if missing is None else [f"model={config.model!r}: {missing}"]


def _dataset_errors(config) -> list[str]:
    errors = []
    if config.model is None:
        errors.append(
            "dataset is set but model is not: the embedded tiny model only reads the synthetic task; "
            "pass --model PATH (a Hugging Face checkpoint) with --dataset"
        )
    if importlib.util.find_spec("math_verify") is None:
        errors.append(
            "dataset is set, and its rewards are graded by math-verify, which is not installed: "
            "pip install 'kpo[train]' (or 'math-verify>=0.8')"
        )
    if not Path(config.dataset).exists():
        return [*errors, f"dataset={config.dataset!r}: file not found"]
    from kpo.data.math import load_problems

    try:
        problems = load_problems(config.dataset, config.problem_key, config.answer_key)
    except (ValueError, KeyError, OSError) as e:
        return [*errors, f"dataset={config.dataset!r}: {e}"]
    if isinstance(config.prompts_per_step, int) and config.prompts_per_step > len(problems):
        errors.append(
            f"prompts_per_step={config.prompts_per_step}: dataset={config.dataset!r} has {len(problems)} problems "
            f"and a generation batch takes that many distinct ones: lower --prompts-per-step to "
            f"{len(problems)} or less"
        )
    return errors


def _output_dir_errors(config) -> list[str]:
    out = Path(config.output_dir)
    existing = file_in_the_way(out)
    if existing is not None:
        return [
            f"output_dir={config.output_dir!r}: {str(existing)!r} is a file, not a directory; choose "
            "another --output-dir"
        ]
    if config.resume and config.overwrite:
        return ["resume and overwrite are exclusive: resume continues the run, overwrite replaces it"]
    if config.resume and not out.is_dir():
        return [
            f"resume: output_dir={config.output_dir!r} does not exist, so there is no run to resume; check the "
            "path, or start the run without --resume"
        ]
    if (why := unwritable(out)) is not None:
        return [f"output_dir={config.output_dir!r}: {why}; choose another --output-dir"]
    if not config.resume and not config.overwrite and (out / "metrics.jsonl").exists():
        return [
            f"output_dir={config.output_dir!r} already holds a run: pass --resume to continue it, "
            "--overwrite to replace it, or another --output-dir"
        ]
    return []


def loss_errors(config) -> list[str]:
    import torch

    from kpo.losses import get_loss_spec, policy_loss

    try:
        spec = get_loss_spec(config.loss)
    except ValueError as e:
        return [f"loss: {e}"]
    errors = []
    # The trainer itself supplies token_entropy (ASPO); a user value would be a [B, T] tensor.
    accepted = {k: v for k, v in spec.hparams.items() if k != "token_entropy"}
    unknown = sorted(set(config.loss_kwargs) - set(accepted))
    if unknown:
        listing = ", ".join(f"{k}={v!r}" for k, v in accepted.items()) or "(none)"
        errors.append(f"loss_kwargs {unknown} not accepted by loss {config.loss!r}; it accepts: {listing}")
    if config.loss_agg_mode is not None and config.loss_agg_mode not in spec.agg_modes:
        errors.append(
            f"loss_agg_mode={config.loss_agg_mode!r} not allowed for loss {config.loss!r}; use one of "
            f"{list(spec.agg_modes)} or leave it unset"
        )
    if errors:
        return errors
    # Values (e.g. q <= 0) are checked by the loss itself: run it once on a 1 x 2 batch.
    lp = torch.zeros(2, 2)
    try:
        policy_loss(
            config.loss,
            log_prob=lp,
            old_log_prob=lp,
            advantages=torch.tensor([1.0, -1.0]),
            response_mask=torch.ones(2, 2),
            loss_agg_mode=config.resolved_agg_mode(),
            **config.resolved_loss_kwargs(),
            # as the trainer supplies it (top_entropy_quantile needs it)
            **({"token_entropy": torch.ones(2, 2)} if "token_entropy" in spec.hparams else {}),
        )
    except (ValueError, TypeError) as e:
        errors.append(f"loss_kwargs for {config.loss!r}: {e}")
    return errors


@functools.cache
def _task_check(task, seed: int, warm_start_seed: int, n_sft: int, prompts_per_step: int) -> tuple[str, ...]:
    """:func:`_task_errors` of these settings, computed once per process: drawing a split and the warm
    start's problems takes seconds for the 128-token task, and kpo compare validates many runs of one task."""
    from kpo.testbed.task import MAX_ROWS, load_split
    from kpo.train.warm_start import sft_problems

    try:
        rl_problems = len(load_split("train", seed=seed, task=task))
    except ValueError as e:
        return (f"task/n_terms/max_value: {e}",)
    errors = []
    task_text = f"the synthetic task ({task.kind}, n_terms={task.n_terms}, max_value={task.max_value})"
    most = task.max_problems("train")
    if n_sft > most:
        grow = "" if most == MAX_ROWS else ", or raise --max-value / --n-terms"  # at MAX_ROWS the task holds more
        errors.append(
            f"sft_examples={n_sft}: {task_text} gives at most {most} distinct training problems "
            f"for the warm start: lower --sft-examples to {most} or less{grow}"
        )
    else:
        try:
            sft_problems(task, n_sft, warm_start_seed)
        except ValueError as e:
            errors.append(f"sft_examples={n_sft}: {e}")
    if prompts_per_step > rl_problems:
        errors.append(
            f"prompts_per_step={prompts_per_step}: {task_text} gives {rl_problems} training prompts and "
            f"a generation batch takes that many distinct ones: lower --prompts-per-step to {rl_problems} "
            "or less, or raise --max-value / --n-terms"
        )
    return tuple(errors)


@functools.cache
def field_kinds(cls: type, name: str) -> tuple[type, ...]:
    """The types the annotation of field ``name`` of dataclass ``cls`` allows: (int,) for ``int``, (int, NoneType)
    for ``int | None`` (cached: resolving the annotations costs milliseconds a field, and every parse and check
    reads them all)."""
    hint = typing.get_type_hints(cls)[name]
    return typing.get_args(hint) or (hint,)


def _has_type(value: Any, kind: type) -> bool:
    """isinstance for config fields: bools are not numbers, ints pass as floats, floats must be finite."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _report_to_errors(report_to: str) -> list[str]:
    """``report_to`` is none, all, or one transformers integration that is installed here."""
    if report_to in ("none", "all"):
        return []
    from transformers.integrations import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

    if report_to not in INTEGRATION_TO_CALLBACK:
        known = ", ".join(sorted(INTEGRATION_TO_CALLBACK))
        return [f"report_to={report_to!r}: unknown; use none, all or one of {known}"]
    available = get_available_reporting_integrations()
    if report_to not in available:
        return [
            f"report_to={report_to!r}: {report_to} is not installed; install it, or use --report-to none"
            + (f" or one of the installed {', '.join(available)}" if available else "")
        ]
    return []


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
