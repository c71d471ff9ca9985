"""What trains the runs of ``kpo compare``: an engine, one seam (:class:`Engine`) between the comparison and a
trainer. The plan, the evaluation, the statistics, the regime map and the reports never branch on which engine
runs: everything a trainer decides is a method here. An engine checks its settings before anything trains, maps
the comparison's and a regime cell's settings to its own, trains one run into its folder (or resumes it), and
hands back its final model (a Hugging Face directory that ``kpo eval`` scores), its metrics (``metrics.jsonl``:
rows with at least ``step``, ``reward_mean``, ``entropy``, ``clip_frac``, each covering what :attr:`Engine.rows`
declares), its configuration as it ran (``config.yaml``, which the report shows) and its ratio dumps
(``ratios/``, :mod:`kpo.analysis.dumps`); once the run is scored, it removes what ``--keep`` (:data:`KEEP`) does
not keep.

``kpo`` (:class:`kpo.compare.engines.kpo.KpoEngine`, the default) and ``verl``
(:class:`kpo.compare.engines.verl.VerlEngine`) are built in. Another trainer is one module with a class that has
these methods, registered by a package's ``kpo.engines`` entry point
(``[project.entry-points."kpo.engines"] NAME = "package.module:EngineClass"``, found in every worker process too)
or by :func:`register_engine`; ``--engine NAME`` then runs it (docs/design.md).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

from kpo.compare.contract import KEEP
from kpo.compare.engines.kpo import KpoEngine
from kpo.compare.engines.verl import VerlEngine

__all__ = ["ENTRY_POINTS", "KEEP", "Engine", "engine_names", "engine_of", "register_engine"]


class Engine(Protocol):
    """One trainer behind ``kpo compare``. ``cfg`` is the :class:`kpo.compare.CompareConfig` (where not said),
    ``run`` a :class:`kpo.compare.Run`, ``out`` the run's folder. Methods marked "worker" run in a worker process."""

    rows: str  # what one metrics.jsonl row covers: STEP_ROWS or BATCH_ROWS

    # ------------------------------------------------------------------ checks, before anything trains
    def flag_errors(self, cfg) -> list[str]:
        """What is wrong with the settings alone (the ``--`` flags setting what the comparison owns, settings
        the engine does not run, what it needs installed): checked before :meth:`config_errors`."""

    def data_errors(self, cfg) -> list[str]:
        """What is wrong with the files the engine reads: ``--dataset`` (in a format its trainer reads) and its
        own configuration file (``--verl-config``), or that file given to an engine that reads none."""

    def config_errors(self, cfg, runs) -> list[str]:
        """What the trainer would reject in the configuration of each distinct run of ``runs`` (the plan's),
        before anything trains."""

    # ------------------------------------------------------------------ a study's cells (a regime map's too)
    def cell_settings(self, cell) -> tuple[str, ...]:
        """A regime cell's (:class:`kpo.compare.cell.Cell`) sampler mismatch and learning rate as the engine's
        own ``--`` settings (its depth is ``--minibatches``, every engine's)."""

    def cell_errors(self, cell, train_args) -> list[str]:
        """Why the engine cannot run ``cell`` (:class:`kpo.compare.cell.Cell`) with its runs' ``--`` settings
        ``train_args``: a mismatch it has no sampler for, a setting that would override what the cell sets
        (:meth:`cell_settings`)."""

    # ------------------------------------------------------------------ the plan and the scoring
    def workers(self, cfg) -> int | None:
        """Parallel runs when ``--jobs`` is not given; None = one per CPU."""

    def plan_lines(self, cfg) -> list[str]:
        """What the plan says in the engine's own terms, after its runs, time and half-widths (verl: the disk a run
        takes at most, the cluster its runs are jobs of); [] where nothing."""

    def embedded(self, cfg) -> bool:
        """Whether ``cfg`` trains the embedded task and model on this engine, the setup the plan's cost constants
        were measured on (:mod:`kpo.compare.plan`); elsewhere the plan's time comes from measured runs."""

    def embedded_task(self, cfg):
        """The embedded task (:class:`kpo.testbed.task.TaskConfig`) whose test split scores the runs when no
        ``--eval-data`` is given, and whose running kind is scored by its exact expected accuracy
        (:func:`kpo.compare.outcome.exact_applies`); None where the engine trains on the user's data only
        (:meth:`flag_errors` then asks for ``--eval-data``)."""

    def eval_settings(self, cfg) -> dict:
        """``kpo eval`` settings that make its prompts the ones the runs trained on (``prompt_template``,
        ``max_new_tokens``) and its ``backend``."""

    # ------------------------------------------------------------------ runs
    def shared_start(self, cfg) -> bool:
        """Whether every seed starts from one model (evaluated once), not from a warm start of its own."""

    def start_model(self, cfg, seed: int) -> Path:
        """Worker: the model seed ``seed``'s runs start from (built first where it has to be)."""

    def train(self, cfg, run, out: Path, resume: bool) -> Path:
        """Worker: train ``run`` into ``out`` (``resume``: continue what an interrupt left, else afresh); returns
        its final model's folder."""

    def prune(self, cfg, out: Path) -> None:
        """Worker, once the run is scored: remove what ``cfg.keep`` (:data:`KEEP`) does not keep; the run stays
        done (:meth:`trained`) and is no longer resumable."""

    def trained(self, cfg, out: Path) -> bool:
        """Whether the run in ``out`` finished training (its metrics and final model are there)."""

    def resumable(self, cfg, run, out: Path) -> bool:
        """Whether the unfinished run in ``out`` can continue with this comparison's settings."""

    def changed(self, cfg, run, out: Path) -> list[str]:
        """``"setting: was -> now"`` for each training setting of the run in ``out`` that differs from now's."""

    def steps_done(self, cfg, out: Path) -> int:
        """Optimizer steps the run in ``out`` has logged (the progress bar's count)."""

    def run_settings(self, cfg, run) -> dict:
        """The settings of ``run`` that shape its trajectory and its length: two runs with equal settings (and
        engine) train the same model (a study's check that its runs are new)."""


ENTRY_POINTS = "kpo.engines"  # the entry-point group of installed packages' engines: NAME = "module:Engine"
_ENGINES: dict[str, Engine] = {}  # name -> engine (--engine NAME)


def register_engine(name: str, engine: Engine) -> None:
    """Make ``engine`` the one ``--engine name`` runs; ValueError when another engine has the name."""
    if _ENGINES.get(name, engine) is not engine:
        raise ValueError(f"engine {name!r}: registered already ({type(_ENGINES[name]).__name__}); choose a new name")
    _ENGINES[name] = engine


def engine_names() -> tuple[str, ...]:
    """The engines' names: those registered, in the order registered, then installed packages' (entry points)."""
    installed = [ep.name for ep in entry_points(group=ENTRY_POINTS) if ep.name not in _ENGINES]
    return (*_ENGINES, *sorted(set(installed)))


def engine_of(cfg) -> Engine:
    """The engine ``cfg.engine`` names, an installed package's loaded (and registered) on first use; ValueError in
    one line naming the known engines when none has that name, or naming the package whose engine fails to load."""
    if cfg.engine not in _ENGINES:
        found = entry_points(group=ENTRY_POINTS, name=cfg.engine)
        if not found:
            raise ValueError(f"--engine={cfg.engine!r}: unknown; use one of {', '.join(engine_names())}")
        ep = next(iter(found))
        try:
            made = ep.load()
            register_engine(cfg.engine, made() if isinstance(made, type) else made)
        except Exception as e:  # noqa: BLE001 - a broken plug-in is the user's package, said in one line
            raise ValueError(f"--engine={cfg.engine!r}: its entry point {ep.value} does not load ({type(e).__name__}: "
                             f"{e}); fix or reinstall the package that provides it") from None
    return _ENGINES[cfg.engine]


register_engine("kpo", KpoEngine())
register_engine("verl", VerlEngine())
