"""``kpo train``'s command line: TRL's own parser (``TrlParser``, on transformers' ``HfArgumentParser``) over
:class:`~kpo.train.config.TrainConfig`, as TRL's scripts parse their configs. Every field is a flag (``--field_name``
or ``--field-name``) whose help is the field's documentation; ``--config FILE`` is a YAML file of fields that the
flags override (TRL's ``env:`` mapping in it sets environment variables); ``none`` sets an optional field to None;
a true-by-default bool also has TRL's ``--no-NAME``.

kpo's additions: ``--loss-kwargs NAME=VALUE ...`` (numbers as numbers, on top of the YAML file's mapping), the
YAML file's values read as the fields' types with every unknown field or non-number named
(:meth:`TrainConfig.coerce`), ``none`` for an optional text field too, and a bare ``--bf16`` meaning true.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import yaml
from trl import TrlParser

from kpo.train.checks import field_kinds
from kpo.train.config import ConfigError, TrainConfig
from kpo.train.settings import loss_kwargs_of

__all__ = ["build_parser", "parse_args"]

FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
DESCRIPTION = (
    "RL post-training with KPO or any importance-ratio baseline (TRL GRPOTrainer). With no arguments: the embedded "
    "tiny model on the synthetic arithmetic task (minutes on a CPU)."
)


class _LossKwargs(argparse.Action):
    """``--loss-kwargs NAME=VALUE ...``: the pairs on top of the mapping so far (the YAML file's, or {})."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            pairs = loss_kwargs_of(values)
        except ConfigError as e:
            raise argparse.ArgumentError(self, "; ".join(e.errors)) from None
        setattr(namespace, self.dest, {**getattr(namespace, self.dest, {}), **pairs})


def _none_or(parse):
    """``parse`` that also reads ``none``/``null`` (any case) as None, for an optional field."""

    def parsed(text: str) -> Any:
        return None if text.lower() in ("none", "null") else parse(text)

    parsed.__name__ = getattr(parse, "__name__", "value")  # argparse names it in "invalid ... value"
    return parsed


class TrainParser(TrlParser):
    """TRL's parser over :class:`TrainConfig` with kpo's additions (module docstring)."""

    def __init__(self, prog: str = "kpo train"):
        super().__init__(TrainConfig, prog=prog, description=DESCRIPTION)
        self.add_argument(
            "--config",
            metavar="FILE",
            help="YAML file of config fields, read as TRL's scripts read theirs (an env: mapping in it sets "
            "environment variables); flags override it.",
        )
        self.config_source = "--config"
        for action in self._actions:
            if action.dest not in FIELDS or action.dest == "loss_kwargs":
                continue
            kinds = field_kinds(TrainConfig, action.dest)
            if type(None) in kinds:
                # TRL reads none as None for optional numbers; kpo train for optional text too (--rollout-is none)
                action.type = _none_or(action.type)
            if bool in kinds and type(None) in kinds:  # bf16: a bare flag is true, as for the other bools
                action.nargs, action.const = "?", True

    @staticmethod
    def _parse_dataclass_field(parser, field: dataclasses.Field):
        if field.name != "loss_kwargs":
            return TrlParser._parse_dataclass_field(parser, field)
        parser.add_argument(
            "--loss_kwargs",
            "--loss-kwargs",
            nargs="*",
            action=_LossKwargs,
            default={},
            metavar="NAME=VALUE",
            help=field.metadata["help"],
        )

    def set_defaults_with_config(self, **values) -> list[str]:
        """TRL's step that makes the ``--config`` file's values the defaults, on the values read as the fields'
        types (:meth:`TrainConfig.coerce`: every unknown field and non-number named at once)."""
        return super().set_defaults_with_config(**TrainConfig.coerce(values, source=self.config_source))


def build_parser(prog: str = "kpo train", *, defaults: bool = True) -> TrainParser:
    """``kpo train``'s parser; with ``defaults=False`` a flag that is not given is left out of the namespace that
    ``parse_args``/``parse_known_args`` return, so its keys are the flags given (``config`` with ``--config``)."""
    parser = TrainParser(prog)
    if not defaults:
        for action in parser._actions:
            if action.dest != "help":
                action.default = argparse.SUPPRESS
    return parser


def parse_args(argv: list[str] | None = None, prog: str = "kpo train") -> TrainConfig:
    """The config of ``--config FILE`` (if given) with the command-line flags on top, parsed by TRL's parser (not
    yet validated). ConfigError for a file that is missing, not YAML or not a mapping of known fields; argparse's
    error (SystemExit) for a flag it cannot read."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    if "--config" in argv:  # the one TRL reads
        at = argv.index("--config")
        if at + 1 == len(argv):
            parser.error("argument --config: expected one argument")
        parser.config_source = path = argv[at + 1]
        if not Path(path).is_file():
            raise ConfigError([f"config file {path!r} not found: give the path of a YAML file of config fields"])
    try:
        config, rest, _, unknown = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except yaml.YAMLError as e:
        raise ConfigError([f"{parser.config_source}: not valid YAML ({e})"]) from None
    except ConfigError:
        raise
    except ValueError as e:  # TRL's: the file is not a mapping, or its env: is not one
        raise ConfigError([f"{parser.config_source}: {e}"]) from None
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if rest.config is not None:  # --config=FILE, a second --config or an abbreviation, which TRL does not read
        parser.error(f"argument --config: give one YAML file as `--config {rest.config}` (TRL reads that form)")
    return config
