"""The ``kpo`` command: a thin dispatcher. Each subcommand's module owns its arguments and work.

Every command module exposes ``main(argv: list[str]) -> int``; modules are imported only when their
command runs, so ``kpo bench`` never imports TRL and ``kpo --help`` is instant.

Ctrl-C (SIGINT) and SIGTERM end every command the same way: one line on stderr, exit status 130, no traceback.
``kpo train`` first writes a checkpoint and its line says how to resume (``kpo.train.interrupt``); the others
say what they keep. A fault of the file system a user can fix (a full disk, a read-only or forbidden path, a
missing file: ``kpo._files``) is one line too, naming the path and what to do, with status 2 (74 for want of
space); so is, on one of several processes, a collective whose other side died (status 1; ``kpo launch`` names
the process that died).
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading

from kpo._exit import INTERRUPTED

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("kpo.train.cli", "train a policy with KPO or any baseline loss (TRL engine)"),
    "eval": ("kpo.evaluation.cli", "avg@k / pass@k on math benchmarks or the embedded task"),
    "analyze": (
        "kpo.analysis.cli",
        "token-dynamics analysis of importance-ratio dumps (Table 2, Figures 1 and 4)",
    ),
    "bench": ("kpo.bench", "benchmarks printed as side-by-side ratios (e.g. `kpo bench filter`)"),
    "summary": ("kpo.train.summary", "one run's summary.json: warm start vs final avg@k with 95% intervals"),
    "compare": ("kpo.compare.cli", "train, evaluate and analyze several methods and seeds into one report"),
    "task": ("kpo.testbed.cli", "write the embedded task (train and held-out files) and its warm start as files"),
    "launch": (
        "kpo.launch",
        "run `kpo train` or `kpo eval` as N data-parallel processes (gloo on CPU, NCCL on GPUs)",
    ),
}

# What an interrupted command keeps, for the commands whose interrupt has no message of its own.
KEPT_ON_INTERRUPT = {
    "train": "stopped before training began; nothing to resume",
    "eval": "with --output (or --cache), the generations finished so far are cached: rerun the same command to "
    "continue",
    "compare": "finished runs are kept: rerun the same command to continue with the others",
}
# How to carry on once a fault is fixed (a full disk, a process that died), for the commands that keep their work.
CARRY_ON = {
    "train": "continue the run with the same command and --resume (from its last complete checkpoint)",
    "eval": "rerun the same command (with --output or --cache it continues from the cached generations)",
    "compare": "rerun the same command (finished runs are kept)",
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: kpo <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `kpo <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if argv[0] in {"-V", "--version"}:
        from kpo import __version__

        print(f"kpo {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kpo: unknown command {name!r}; valid commands: {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(_usage(), file=sys.stderr)
        return 2
    previous = (
        signal.signal(signal.SIGTERM, _terminate)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except KeyboardInterrupt as e:
        message = str(e) or f"interrupted; {KEPT_ON_INTERRUPT.get(name, 'nothing kept')}"
        _close_bars()
        print(f"kpo {name}: {message}", file=sys.stderr, flush=True)
        return INTERRUPTED
    except Exception as e:
        said = _one_line(name, e)
        if said is None:
            raise  # a bug: its traceback
        line, status = said
        _close_bars()
        print(f"kpo {name}: {line}", file=sys.stderr, flush=True)
        return status
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _one_line(name: str, exc: Exception) -> tuple[str, int] | None:
    """(line, exit status) of a failure that is not a bug (module docstring), or None."""
    from kpo import _distributed
    from kpo._files import file_fault

    fault = file_fault(exc)
    if fault is not None:
        line, status = fault
        return (f"{line}, then {CARRY_ON[name]}" if name in CARRY_ON else line), status
    if _distributed.peer_lost(exc):
        return (
            f"rank {_distributed.rank()} of {_distributed.world_size()} stopped: another rank of this run ended, so "
            "an exchange with it failed (the launcher names it and why)",
            1,
        )
    return None


def _close_bars() -> None:
    """Close the progress bars an interrupt left open, so the interrupt's line is not written onto a bar and no
    bar is redrawn after it."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        for bar in list(tqdm.tqdm._instances):
            bar.close()


def _terminate(signum, frame) -> None:
    """SIGTERM (a scheduler's stop, ``kill``) ends a command as Ctrl-C does, instead of killing it mid-write."""
    raise KeyboardInterrupt


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
