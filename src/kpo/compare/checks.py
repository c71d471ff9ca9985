"""Every check of a comparison's settings (:class:`kpo.compare.CompareConfig`) that does not depend on its engine,
before anything trains: the ranges of its numbers, the names of its methods and ablations, the looks, the steps
and ratio-dump periods, ``--out``, ``--model`` and ``--eval-data``. Each problem is one line with its fix; the
engine adds its own (:meth:`kpo.compare.engines.Engine.flag_errors` and the others)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kpo._checks import PROBLEM_FILES, file_errors, file_in_the_way, no_tokenizer, unwritable
from kpo.compare.contract import keep_errors
from kpo.compare.defaults import ABLATIONS, DEFAULT_ABLATIONS
from kpo.compare.engines import engine_of
from kpo.compare.stats import MOST_SEEDS

__all__ = ["WEIGHT_FILES", "out_errors", "settings_errors"]


def settings_errors(cfg) -> tuple[tuple[str, ...], list[str]]:
    """(the methods by their canonical names, every problem of the settings that the engine does not decide)."""
    methods, errors = _canonical_methods(cfg.methods)
    errors = out_errors(cfg.out) + _range_errors(cfg) + errors + _data_errors(cfg) + keep_errors(cfg)
    return methods, errors


def _canonical_methods(names: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """(canonical loss names in the given order, errors): unknown names and losses listed twice (aliases too)."""
    from kpo.losses import get_loss_spec

    if not names:
        return (), ["--methods: give at least one loss name"]
    given: dict[str, list[str]] = {}  # canonical name -> the names that asked for it
    errors = []
    for name in names:
        try:
            given.setdefault(get_loss_spec(name).name, []).append(name)
        except ValueError as e:
            errors.append(f"--methods: {e}")
    for canonical, asked in given.items():
        if len(asked) > 1:
            errors.append(f"--methods: {', '.join(asked)} all name the loss {canonical!r}; list each loss once")
    return tuple(given), errors


def _range_errors(cfg) -> list[str]:
    """Integer settings outside their allowed range (None = the default, always allowed)."""
    seeds = max(cfg.seeds, 1)
    # at most MOST_SEEDS seeds: the plan makes a run folder per seed and arm
    upper = {"seeds": MOST_SEEDS, "sweep_seeds": seeds, "ablation_seeds": seeds, "aa_seeds": seeds}
    lower = {"aa_seeds": 0}
    default = {
        "eval_limit": "the whole test split",
        "jobs": "one per CPU",
        "sweep_seeds": "all seeds",
        # what the comparison takes where the option is not given (--quick's, and at most --seeds)
        **{name: _omitted(cfg, name, unit) for name, unit in _FILLED.items()},
    }
    errors = _ablation_arm_errors(cfg)
    for name in "seeds steps minibatches ablation_seeds aa_seeds sweep_seeds eval_n eval_limit dump_every jobs".split():
        value, hi, lo = getattr(cfg, name), upper.get(name), lower.get(name, 1)
        if value is None or (value >= lo and (hi is None or value <= hi)):
            continue
        if name in upper and name != "seeds" and cfg.seeds < 1:
            continue  # bounded by --seeds, which is reported itself (and filled from it when omitted)
        allowed = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
        omit = f" (or omit it for {default[name]})" if name in default else ""
        errors.append(f"--{name.replace('_', '-')}={value}: must be {allowed}{omit}")
    if not {e.split("=")[0] for e in errors} & {"--steps", "--minibatches", "--dump-every"}:
        errors += _steps_errors(cfg) or _dump_period_errors(cfg)
    return errors


# Settings CompareConfig fills where they are not given -> their unit
_FILLED = {"seeds": "seeds", "steps": "steps", "ablation_seeds": "seeds", "aa_seeds": "seeds"}


def _omitted(cfg, name: str, unit: str) -> str:
    """"N units": what ``name`` is when its option is not given, as CompareConfig fills it (the defaults,
    --quick's, at most --seeds)."""
    n = getattr(dataclasses.replace(cfg, **{name: None}), name)
    return f"{n} {unit if n != 1 else unit.removesuffix('s')}"


def _steps_errors(cfg) -> list[str]:
    """--steps that does not end a generation batch (kpo train's own check would name its field, max_steps)."""
    if cfg.steps % cfg.minibatches == 0:
        return []
    up = -(-cfg.steps // cfg.minibatches) * cfg.minibatches
    return [
        f"--steps={cfg.steps}: must be a multiple of --minibatches={cfg.minibatches} (a run ends with a whole "
        f"generation batch): use --steps={up} or another multiple"
    ]


def _ablation_arm_errors(cfg) -> list[str]:
    """--ablation-arms naming an unknown arm, an arm twice, or arms that --no-matched / --no-ablations leave out
    (the ablations are contrasts against KPO at the matched memory)."""
    arms_given = cfg.ablation_arms
    unknown = sorted(set(arms_given) - set(ABLATIONS))
    errors = [f"--ablation-arms {unknown}: unknown; choose among {', '.join(ABLATIONS)}"] if unknown else []
    twice = sorted({a for a in arms_given if arms_given.count(a) > 1})
    if twice:
        errors.append(f"--ablation-arms: {', '.join(twice)} listed more than once; list each arm once")
    off = [flag for flag, on in (("--no-matched", cfg.matched), ("--no-ablations", cfg.ablations)) if not on]
    if off and arms_given and tuple(arms_given) != DEFAULT_ABLATIONS:
        errors.append(
            f"--ablation-arms {','.join(arms_given)}: not run with {' and '.join(off)} (each ablation is a contrast "
            f"against KPO at the matched memory); drop {' and '.join(off)} to run them, or drop --ablation-arms"
        )
    return errors


def _has_analyzed_dump(steps: int, every: int, minibatches: int) -> bool:
    """Whether dumping every ``every`` optimizer steps of a ``steps``-step run dumps a step Table 2 analyzes: an
    off-policy one (not the first step of a generation batch of ``minibatches`` steps), or any step when
    ``minibatches`` = 1 (no step is off-policy; Table 2 then says so)."""
    from kpo.protocol import on_policy_step

    return any(minibatches == 1 or not on_policy_step(s, minibatches) for s in range(every, steps + 1, every))


def _dump_period_errors(cfg) -> list[str]:
    """--dump-every that dumps no step Table 2 can analyze within --steps (its settings are in range)."""
    steps, every, m = cfg.steps, cfg.dump_every, cfg.minibatches
    if _has_analyzed_dump(steps, every, m):
        return []
    # the longest period up to the asked one that works (p = minibatches always does, as steps >= it)
    fix = next(p for p in range(min(every, steps), 0, -1) if _has_analyzed_dump(steps, p, m))
    steps_text = f"--steps={steps}"
    if every > steps:
        problem = f"is longer than {steps_text}: no ratio dump would be written, so Table 2 would be empty"
    else:  # one dump only: steps s and 2s are not both 1 more than a multiple of m > 1, so 2s would be analyzed
        problem = (
            f"with {steps_text} dumps only step {every}, the first (on-policy) step of a generation batch of "
            f"--minibatches={m}; Table 2 analyzes off-policy steps"
        )
    return [f"--dump-every={every} {problem}: use --dump-every={fix} (or more --steps)"]


# A model's weights as save_pretrained writes them: one file, or shards listed in an index
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def out_errors(out: str) -> list[str]:
    """``--out`` that cannot hold the runs: empty (they would be written into the current folder), under a file, or
    where this user cannot write. Each line names the path in the way, not the folder asked for, so that a regime
    map's cells (folders under one --out) give the same line, said once."""
    if not str(out).strip():
        return ["--out '': empty, so everything would be written into the current folder; give a folder"]
    existing = file_in_the_way(Path(out))
    if existing is not None:
        return [f"--out: {str(existing)!r} is a file, not a folder; choose another --out"]
    why = unwritable(Path(out))
    return [] if why is None else [f"--out: {why}; choose another --out"]


def _data_errors(cfg) -> list[str]:
    """Files the comparison reads that are not there or not what they should be, before anything trains:
    ``--model`` (a Hugging Face folder with its config, tokenizer and readable weights), each ``--eval-data``
    benchmark (read as kpo eval reads it), then the engine's own (:meth:`kpo.compare.engines.Engine.data_errors`:
    ``--dataset`` in a format its trainer reads, ``--verl-config``)."""
    from kpo.data.math import UndetectedFormat, load_problems

    errors = [] if cfg.model is None else _model_errors(cfg.model)
    for path in dict.fromkeys(cfg.eval_data):
        found = file_errors("--eval-data", path, PROBLEM_FILES, "a held-out benchmark")
        if not found:
            try:
                load_problems(path)
            except UndetectedFormat as e:  # kpo compare names no fields: the format is detected, or nothing
                found = [
                    f"--eval-data {e.where}: cannot detect the format from fields {e.fields}; kpo compare reads the "
                    "formats kpo eval detects (docs/eval.md): rename the fields problem and answer"
                ]
            except (ValueError, OSError) as e:  # OSError: no permission
                found = [f"--eval-data {path}: {e}; give a benchmark file in a format kpo eval reads"]
        errors += found
    resolved = [Path(p).resolve() for p in cfg.eval_data]
    twice = [p for p, r in zip(cfg.eval_data, resolved) if resolved.count(r) > 1]
    if twice:
        errors.append(
            f"--eval-data: {', '.join(dict.fromkeys(twice))} listed more than once; list each file once"
        )
    if len({r.stem for r in set(resolved)}) < len(set(resolved)):
        errors.append(
            "--eval-data: two files share a name (kpo eval names a benchmark by its file name); rename one"
        )
    return errors + engine_of(cfg).data_errors(cfg)


def _model_errors(model: str) -> list[str]:
    """``--model`` that cannot be loaded: not a folder, no config.json, no tokenizer, weights missing or damaged."""
    folder, where = Path(model), f"--model {model}"
    if not folder.is_dir():
        return [f"{where}: no such folder; give a Hugging Face model folder (save_pretrained's)"]
    if not (folder / "config.json").is_file():
        return [f"{where}: no config.json there; give a Hugging Face model folder (save_pretrained's)"]
    missing = no_tokenizer(folder)
    problem = _weights_problem(folder) if missing is None else missing
    return [] if problem is None else [f"{where}: {problem}"]


def _weights_problem(folder: Path) -> str | None:
    """What is wrong with the weights in the model folder ``folder`` (none of :data:`WEIGHT_FILES`, a shard of an
    index missing, a safetensors file whose header does not describe the file), or None. Reads headers only."""
    import json

    from safetensors import safe_open

    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        return f"no weights there (one of {', '.join(WEIGHT_FILES)}); save the model with model.save_pretrained(DIR)"
    files = [folder / present[0]]
    if present[0].endswith(".index.json"):
        try:
            files = [
                folder / name for name in sorted(set(json.loads(files[0].read_text())["weight_map"].values()))
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{present[0]} is not a shard index ({type(e).__name__}: {e}); save the model again"
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            return f"{present[0]} lists {', '.join(absent)}, which are not there; copy the whole folder"
    for path in files:
        if path.suffix == ".safetensors":
            try:
                with safe_open(path, framework="pt"):
                    pass
            except Exception as e:  # noqa: BLE001 - safetensors' own errors: the file is damaged
                return f"{path.name} cannot be read ({e}): damaged or cut short; save or copy the model again"
    return None
