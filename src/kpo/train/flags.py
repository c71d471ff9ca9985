"""``kpo train``'s command line: every :class:`~kpo.train.config.TrainConfig` field is a flag (``--field-name`` or
``--field_name``) whose help is the field's documentation, on top of a YAML file (``--config``), TRL's convention.

A flag's type follows the field's annotation: ``int | None`` takes ``none``, a bool flag alone means true, and
``--loss-kwargs`` takes NAME=VALUE pairs (numbers as numbers). An unset flag leaves the YAML file's value.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import yaml

from kpo.train.checks import field_kinds
from kpo.train.config import ConfigError, TrainConfig, parse_scalar

__all__ = ["build_parser", "parse_args"]


def _show_default(value: Any) -> str:
    """A default as it is written on the command line: none, true/false, {} or the value itself."""
    if value is None or isinstance(value, bool):
        return yaml.safe_dump(value).split("\n")[0].replace("null", "none")
    return str(value)


def _parse_bool(text: str) -> bool:
    value = yaml.safe_load(text)
    if not isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return value


def _parse_optional(kind):
    def parse(text: str):
        if text.lower() in ("none", "null"):
            return None
        return kind(text)

    parse.__name__ = kind.__name__
    return parse


def _parse_kwarg(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"loss kwarg {text!r}: write NAME=VALUE, e.g. q=1e-4")
    key, value = text.split("=", 1)
    return key.strip(), parse_scalar(value)


def build_parser(prog: str = "kpo train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="RL post-training with KPO or any importance-ratio baseline (TRL GRPOTrainer). "
        "With no arguments: the embedded tiny model on the synthetic arithmetic task (minutes on a CPU).",
    )
    parser.add_argument("--config", help="YAML file of config fields; flags override it.")
    defaults = TrainConfig().to_dict()
    for f in dataclasses.fields(TrainConfig):
        flags = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        # The flag's own default stays SUPPRESS, so an unset flag leaves the YAML file's value in place;
        # the help shows the dataclass default that applies when neither sets it.
        help_text = f"{f.metadata['help']} (default: {_show_default(defaults[f.name])})".replace("%", "%%")
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        kinds = field_kinds(TrainConfig, f.name)
        optional = type(None) in kinds
        if f.name == "loss_kwargs":
            kw |= {"nargs": "*", "type": _parse_kwarg, "metavar": "NAME=VALUE"}
        elif bool in kinds:
            kw |= {"nargs": "?", "const": True, "type": _parse_bool, "metavar": "BOOL"}
        elif int in kinds:
            kw["type"] = _parse_optional(int) if optional else int
        elif float in kinds:
            kw["type"] = float
        else:
            kw["type"] = _parse_optional(str) if optional else str
        parser.add_argument(*flags, **kw)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Config from ``--config FILE`` (if given) with command-line flags on top (not yet validated)."""
    args = vars(build_parser().parse_args(argv))
    path = args.pop("config", None)
    base = TrainConfig.from_yaml(path).to_dict() if path else {}
    if "loss_kwargs" in args:
        pairs = args.pop("loss_kwargs")
        keys = [k for k, _ in pairs]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError([f"--loss-kwargs sets {dupes} more than once"])
        base["loss_kwargs"] = {**base.get("loss_kwargs", {}), **dict(pairs)}
    base.update(args)
    return TrainConfig.from_dict(base, source="command line")
