"""verl's configuration as ``kpo compare --engine verl`` reads it (:mod:`kpo.compare.engines.verl`): composed as
main_ppo composes it (Hydra, verl's ``ppo_trainer`` or the user's ``--verl-config``), and checked before anything
trains: the user's YAML builds on verl's trainer configuration, the actor is FSDP's, each value has the type of
the field of verl's config class that reads it, and main_ppo's own check passes."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

__all__ = ["ABSENT", "ACTOR", "VERL_TRAINERS", "compose", "compose_fresh", "hydra_free", "keys_set", "megatron_errors",
           "one_line", "override_key", "select", "type_errors", "unresolved", "value_errors", "verl_check",
           "verl_config_errors"]

ACTOR = "actor_rollout_ref.actor"
VERL_TRAINERS = ("ppo_trainer", "ppo_megatron_trainer")  # verl's configurations main_ppo builds on


def override_key(override: str) -> str:
    """The config key a Hydra override sets: ``+a.b=1`` -> ``a.b``, ``~a.b`` -> ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~")


def _config_dir() -> str:
    """verl's own configuration folder (``ppo_trainer.yaml``), found without importing verl."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def keys_set(override: str) -> tuple[str, ...]:
    """The config keys a Hydra override sets: its key, or for a mapping value (``a.b={c:1,d:{e:2}}``) each key
    under it (``a.b.c``, ``a.b.d.e``); an override Hydra cannot parse gives its key (Hydra says why later)."""
    key = override_key(override)
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
    except ImportError:  # no verl here (hydra is verl's): flag_errors says so
        return (key,)
    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
        value = parsed.value()
    except Exception:  # noqa: BLE001 - Hydra's grammar errors: the composition reports them in full
        return (key,)

    def leaves(prefix: str, node) -> list[str]:
        if isinstance(node, dict) and node:
            return [leaf for k, v in node.items() for leaf in leaves(f"{prefix}.{k}", v)]
        return [prefix]

    return tuple(leaves(key, value))


def compose_fresh(verl_config: str | None, overrides: tuple[str, ...]):
    """verl's configuration as main_ppo composes it: ``verl_config`` (a YAML file, as ``--config-path`` and
    ``--config-name``) or verl's ``ppo_trainer``, with ``overrides``."""
    from hydra import compose, initialize_config_dir

    folder, name = (
        (str(Path(verl_config).resolve().parent), Path(verl_config).stem)
        if verl_config
        else (_config_dir(), "ppo_trainer")
    )
    with initialize_config_dir(config_dir=folder, version_base=None):
        return compose(name, overrides=list(overrides))


# the same, composed once per process and read only (a composition takes 0.3 s, the first 4 s)
compose = lru_cache(maxsize=32)(compose_fresh)


def select(composed, key: str):
    from omegaconf import OmegaConf

    return OmegaConf.select(composed, key)


ABSENT = object()  # no such key (a value may be None)


def unresolved(config, key: str):
    """The value at ``key`` as written (interpolations unresolved, so that ``${...}`` compares as text), or
    :data:`ABSENT`."""
    from omegaconf import DictConfig, OmegaConf

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent, default=None, throw_on_resolution_failure=False) if parent else config
    if not isinstance(node, DictConfig) or leaf not in node:
        return ABSENT
    child = node._get_node(leaf)
    return child._value() if not isinstance(child, DictConfig) else OmegaConf.to_container(child, resolve=False)


def one_line(e: BaseException) -> str:
    """An exception in one line, in full (Hydra's and verl's messages span lines)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def megatron_errors(composed) -> list[str]:
    if select(composed, f"{ACTOR}.strategy") != "megatron":
        return []
    return [
        f"{ACTOR}.strategy=megatron: kpo compare runs verl's FSDP actor only (kpo's actor config extends "
        "FSDPActorConfig, and kpo eval scores the FSDP checkpoint's Hugging Face weights); use fsdp or fsdp2"
    ]


def type_errors(composed) -> list[str]:
    """Every value of ``composed`` that the field of verl's config class reading it (the ``_target_`` of its
    section) does not take: an int, float or bool field given something else, refused as OmegaConf's typed merge
    refuses it (verl's ``omega_conf_to_dataclass`` with a class; main_ppo's ``_target_`` instantiation skips the
    check, and a learning rate "abc" would fail in the optimizer, minutes into the run)."""
    import dataclasses
    import types
    import typing

    from hydra.utils import get_class
    from omegaconf import DictConfig, ValidationError
    from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode

    nodes = {int: IntegerNode, float: FloatNode, bool: BooleanNode}
    errors = []

    def walk(node: DictConfig, path: str) -> None:
        target = node._get_node("_target_")._value() if "_target_" in node else None
        try:
            cls = get_class(target) if isinstance(target, str) and target else None
            hints = typing.get_type_hints(cls) if cls is not None and dataclasses.is_dataclass(cls) else {}
        except Exception:  # noqa: BLE001 - not a class verl can import here: main_ppo's own check says so
            cls, hints = None, {}
        for key in node:
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                walk(child, f"{path}{key}.")
                continue
            hint = hints.get(key)
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            kinds = [k for k in (typing.get_args(hint) if union else (hint,)) if k in nodes]
            value = getattr(child, "_value", lambda: None)()
            if not kinds or value is None or (isinstance(value, str) and "${" in value):
                continue
            try:
                nodes[kinds[0]](value)
            except ValidationError:
                errors.append(
                    f"{path}{key}={value}: verl's {cls.__name__}.{key} takes a {kinds[0].__name__}, not "
                    f"{type(value).__name__} {value!r}; give one"
                )

    walk(composed, "")
    return errors


def value_errors(composed) -> list[str]:
    """What verl's config classes take but a comparison cannot run, or what they never check: each value named
    where it is read, with what it must be (kpo train refuses the same)."""
    import math

    errors = []
    for key, what in (
        ("data.train_batch_size", "prompts per generation batch, an integer >= 1"),
        (f"{ACTOR}.ppo_epochs", "passes over a generation batch, an integer >= 1"),
    ):
        value = select(composed, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            errors.append(f"{key}={value}: must be {what}")
    freq = select(composed, "trainer.save_freq")
    if not isinstance(freq, int) or isinstance(freq, bool):
        errors.append(
            f"trainer.save_freq={freq}: must be an integer (verl's training steps between checkpoints; <= 0: kpo "
            "compare saves at the run's end only)"
        )
    lr = select(composed, f"{ACTOR}.optim.lr")
    if not isinstance(lr, int | float) or isinstance(lr, bool) or not (math.isfinite(lr) and lr > 0):
        errors.append(f"{ACTOR}.optim.lr={lr}: must be a finite number > 0")
    n, low = select(composed, "actor_rollout_ref.rollout.n"), 1
    if select(composed, "algorithm.adv_estimator") != "gae":  # a group estimator compares a prompt's responses
        low = 2
    if not isinstance(n, int) or isinstance(n, bool) or n < low:
        why = " (a group advantage compares at least 2 responses per prompt)" if low == 2 else ""
        errors.append(f"actor_rollout_ref.rollout.n={n}: must be an integer >= {low}{why}")
    return errors


def hydra_free(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """The overrides without Hydra's own settings (``hydra.*``), which the compose API refuses."""
    return tuple(o for o in overrides if not override_key(o).startswith("hydra."))


def verl_check(verl_config: str | None, overrides: tuple[str, ...]) -> list[str]:
    """What main_ppo's own check (``validate_config``) and kpo's actor config reject in this run's configuration."""
    try:
        composed = compose_fresh(verl_config, hydra_free(overrides))  # validate_config may write into it
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        validate_config(
            composed, use_reference_policy=need_reference_policy(composed), use_critic=need_critic(composed)
        )
    except Exception as e:  # noqa: BLE001 - verl asserts and raises many types; each is shown in full
        return [f"verl's configuration check: {one_line(e)}"]
    return []


def verl_config_errors(path: str) -> list[str]:
    """A ``--verl-config`` that is not a YAML mapping building on verl's trainer configuration (without it every
    override of verl's settings fails in Hydra, which blames the override, not the file)."""
    import yaml

    where = f"--verl-config {path}"
    fix = (
        f"start it with `defaults: [{VERL_TRAINERS[0]}, _self_]` and `hydra: {{searchpath: "
        "[pkg://verl.trainer.config]}` (as examples/verl/cpu_tiny.yaml), or leave --verl-config out for verl's own"
    )
    found = Path(path)
    if found.is_dir():
        return [f"{where}: a folder; give the YAML file of your verl configuration"]
    if not found.is_file():
        return [f"{where}: no such file; give the YAML file of your verl configuration"]
    try:
        data = yaml.safe_load(found.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        return [f"{where}: not YAML ({str(e).splitlines()[0]}); give the YAML file of your verl configuration"]
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a YAML {type(data).__name__} ({str(data)[:40]})"
        return [f"{where}: {what}, not a verl configuration; {fix}"]
    entries = data.get("defaults") if isinstance(data.get("defaults"), list) else []
    # an entry is a config's name, or a mapping from a config group (or name) to its option
    names = {str(name) for e in entries for name in (e if isinstance(e, dict) else [e])}
    if not names & set(VERL_TRAINERS):
        return [f"{where}: its defaults do not name verl's {VERL_TRAINERS[0]}, so it lacks verl's settings; {fix}"]
    return []
