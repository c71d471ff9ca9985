"""Running ``kpo compare regimes`` (:mod:`kpo.compare.regimes`): every missing run of every cell trained at the
map's seeds (:func:`run_regimes`); each cell's own ``kpo compare`` report and the map rewritten as cells finish."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from kpo._files import write_json
from kpo.compare.engines import engine_of
from kpo.compare.plan import CompareError, plan_runs, share_warm_starts, shared_start_dir
from kpo.compare.regimes.design import (
    DIFF_SD,
    Cell,
    RegimeConfig,
    answers,
    cell_entry,
    cell_runs,
)
from kpo.compare.regimes.plan import check_plan, estimate_regimes, format_regime_plan, read_plan

__all__ = ["run_regimes", "write_cell_report", "write_regime_report"]


def run_regimes(
    cfg: RegimeConfig, *, plan_only: bool = False, report_only: bool = False, pilot: Path | None = None
) -> Path | None:
    """Print the plan, the questions and the rules; then train every missing run of every cell (rewriting the map
    as each cell finishes) and write the map. Returns report.md (None with ``plan_only``). ``report_only`` trains
    nothing: the map is written as it stands."""
    from kpo.compare.plan import pilot_sd
    from kpo.compare.run import holding

    if plan_only and report_only:
        raise CompareError(["--plan and --report: --plan prints the plan and stops, --report writes the map; give one"])
    cfg.validate()
    out = Path(cfg.out)
    on_disk = read_plan(out / "plan.json")
    if report_only and on_disk is None:
        raise CompareError([f"{out}: no map here (no plan.json); --report rewrites a map: give its --out, or run "
                            "without --report to start one"])
    est = estimate_regimes(cfg, pilot_sd(pilot) if pilot is not None else DIFF_SD, pilot)
    print(format_regime_plan(cfg, est), flush=True)
    if on_disk is not None:
        check_plan(out / "plan.json", on_disk, est)
    if plan_only:
        return None
    with holding(out, "kpo compare regimes"):
        return _run_locked(cfg, out, on_disk, est, report_only)


def _run_locked(cfg: RegimeConfig, out: Path, on_disk: dict | None, est: dict, report_only: bool) -> Path:
    from kpo.compare.plan import parallel_runs
    from kpo.compare.run import Job, _done, _stale_run_errors, train_jobs

    errors = _torn_files(cfg)
    for cell in cfg.cells if not errors else ():
        cell_cfg = cfg.cell_config(cell, cfg.seeds)
        errors += _stale_run_errors(cell_cfg, plan_runs(cell_cfg), Path(cell_cfg.out))
    if errors:
        raise CompareError(errors)
    if on_disk is None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "plan.json", est, indent=2)

    def missing(cell: Cell) -> list[Job]:
        cell_cfg = cfg.cell_config(cell, cfg.seeds)
        folder = Path(cell_cfg.out) / "runs"
        return [Job(cell_cfg, r, folder / r.name, f"{cell.name}/{r.name}") for r in plan_runs(cell_cfg)
                if not _done(cell_cfg, folder / r.name)]

    by_name = {cell.name: cell for cell in cfg.cells}

    def on_done(job: Job) -> list:
        cell = by_name[Path(job.cfg.out).name]
        if not missing(cell):
            write_cell_report(cfg, cell)
            write_regime_report(cfg)
        return []

    todo = [job for cell in cfg.cells for job in missing(cell)]
    total = sum(len(cell_runs(cfg, cell, cfg.seeds)) for cell in cfg.cells)
    if report_only and len(todo) == total:
        raise CompareError([f"{out}: no run has finished yet ({total} to train); run without --report to train them"])
    if not report_only:
        share_warm_starts(out, [cell.name for cell in cfg.cells], range(cfg.seeds))
        print(f"kpo compare regimes: {cfg.seeds} seeds a cell; {len(todo)} runs to train; map in {out}", flush=True)
        if todo:
            train_jobs(todo, parallel_runs(cfg.cell_config(cfg.cells[0], cfg.seeds)), on_done)
    for cell in cfg.cells:
        write_cell_report(cfg, cell)
    return write_regime_report(cfg)


def _torn_files(cfg: RegimeConfig) -> list[str]:
    """One line per file of the map's models (runs up to the cap, warm starts) that a stop mid-write left torn:
    an evaluation that is not JSON (or not a finished one, :func:`kpo.compare.outcome.load_outcome`), a file the
    engine reads back (:meth:`kpo.compare.engines.Engine.torn_files`)."""
    from kpo.compare.outcome import EVAL_FILE, load_outcome, read_evaluation

    engine = engine_of(cfg)
    out = Path(cfg.out)
    folders = [shared_start_dir(out, s) for s in range(cfg.seeds)]
    folders += [out / c.name / "runs" / r.name for c in cfg.cells for r in cell_runs(cfg, c, cfg.seeds)]
    errors = []
    for folder in (f for f in folders if f.is_dir()):
        try:  # eval.json too where expected.json is the outcome: a cell's compare report reads both
            load_outcome(folder)
            if (folder / EVAL_FILE).exists():
                read_evaluation(folder / EVAL_FILE)
        except CompareError as e:
            errors += e.errors
        # YAML's errors span lines
        errors += [" ".join(f"{why}; delete {folder} to redo it".split()) for why in engine.torn_files(folder)]
    return errors


def write_cell_report(cfg: RegimeConfig, cell: Cell) -> Path | None:
    """The cell's own ``kpo compare`` report (its Table 1, contrasts, Figure 3, Table 2) in ``OUT/CELL/``, over
    the seeds every run of it finished; None before two seeds have."""
    from kpo.compare.report import write_report
    from kpo.compare.run import _done

    finished = 0
    while finished < cfg.seeds:
        cell_cfg = cfg.cell_config(cell, finished + 1)
        folder = Path(cell_cfg.out) / "runs"
        if not all(_done(cell_cfg, folder / r.name) for r in plan_runs(cell_cfg) if r.seed == finished):
            break
        finished += 1
    if finished < 2:
        return None
    cell_cfg = cfg.cell_config(cell, finished)
    folder = Path(cell_cfg.out)
    write_json(folder / "compare.json", asdict(cell_cfg), indent=2)
    return write_report(cell_cfg, plan_runs(cell_cfg), folder)


def write_regime_report(cfg: RegimeConfig) -> Path:
    """The map as it stands: ``report.md``, ``report.json`` (``cells``: :func:`cell_entry` of each; ``questions``:
    :func:`kpo.compare.regimes.answers`), ``regimes.png`` and ``memory.png`` in ``cfg.out``; returns report.md."""
    from kpo.compare.regimes.report import render_map

    out = Path(cfg.out)
    entries = [cell_entry(cfg, cell, cfg.seeds) for cell in cfg.cells]
    return render_map(out, entries, answers(cfg, entries), read_plan(out / "plan.json") or {})
