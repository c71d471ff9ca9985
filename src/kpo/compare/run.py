"""The execution of ``kpo compare``: each seed's warm start, then the runs in parallel worker processes (one torch
thread each), each trained and evaluated on the held-out split; finished runs are reused, and a finished run made
with other settings is an error. A worker holds its run's lock while it trains, scores and prunes the run, and dies
with kpo compare (:mod:`kpo.compare.guards`); a compare finding a run locked stops before anything trains."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

from kpo._files import replacing, write_json
from kpo._progress import progress_bar
from kpo.compare.contract import size_text
from kpo.compare.engines import engine_of
from kpo.compare.guards import busy, busy_line, die_with_parent, lock_holder, lock_run, unlock_run
from kpo.compare.outcome import EVAL_FILE, EXPECTED_FILE, exact_applies, read_evaluation
from kpo.compare.plan import (
    DIFF_SD,
    TIMING_FILE,
    CompareConfig,
    CompareError,
    Run,
    estimate,
    format_plan,
    held_out_problems,
    measured_run_seconds,
    parallel_runs,
    pilot_sd,
    plan_runs,
    warm_start_dir,
)
from kpo.compare.report import write_report


class RunsFailed(RuntimeError):
    """Runs of a comparison failed (each named with its log); the others ended first."""


@contextlib.contextmanager
def holding(folder: Path, what: str):
    """Hold the lock of ``folder`` (a comparison's ``--out``, a map's, a study's) while the block runs, so that two
    processes never work on one; CompareError in one line, before anything else, when another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    if lock_run(folder) is None:
        holder, lock, fix = lock_holder(folder)
        raise CompareError([f"{folder}: process {holder} is running {what} here (lock {lock}); {fix}"])
    try:
        yield
    finally:
        unlock_run(folder)


def _log_to(out: Path) -> None:
    """Worker: send this process's output (fds 1 and 2) to ``out/log.txt``, after a line that starts the run
    there (a rerun appends to the log of the failed attempt), and train on one torch thread."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    # Workers are reused across runs: flush what belongs to the previous run's log, then point fds 1 and 2 here.
    sys.stdout.flush()
    sys.stderr.flush()
    with open(out / "log.txt", "a") as log:
        log.write(f"=== kpo compare: {out.name} started {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
        log.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    torch.set_num_threads(1)


# In a worker: an interrupt stopped one of its runs. The pool had already handed it the next run (it queues one
# run ahead of its workers), which must not start: kpo compare is waiting for its workers to stop.
_interrupted = False


def _execute(cfg: CompareConfig, run: Run, out: Path, resume: bool = False) -> dict:
    """Worker: train one run through its engine (``resume``: from what an interrupt left, else afresh), then
    evaluate its final model. Output goes to ``out/log.txt``, and so does the traceback of an error (SystemExit
    included) before it reaches kpo compare, which prints one line of it. After an interrupt the worker starts
    no other run."""
    if _interrupted:
        raise KeyboardInterrupt(f"{run.name} not started: kpo compare was interrupted")
    if lock_run(out) is None:
        raise RuntimeError(busy_line(out))
    try:
        return _execute_locked(cfg, run, out, resume)
    finally:
        unlock_run(out)


def _execute_locked(cfg: CompareConfig, run: Run, out: Path, resume: bool) -> dict:
    global _interrupted
    _log_to(out)
    start = time.time()
    engine = engine_of(cfg)
    try:
        final = engine.train(cfg, run, out, resume)
        results = _evaluate(cfg, final, out / EVAL_FILE)
        if exact_applies(cfg):
            _evaluate_exact(cfg, final, out / EXPECTED_FILE)
        written = disk_bytes(out)
        engine.prune(cfg, out)
        write_json(out / TIMING_FILE, {"seconds": time.time() - start})  # what the next plan of this setup reads
    except BaseException as e:
        _interrupted = isinstance(e, KeyboardInterrupt)
        sys.stdout.flush()
        sys.stderr.flush()
        with open(out / "log.txt", "a") as log:
            traceback.print_exc(file=log)
        raise
    disk = {"written": written, "kept": disk_bytes(out)}
    kept = f"{size_text(disk['written'])} written, {size_text(disk['kept'])} kept (--keep {cfg.keep})"
    print(f"kpo compare: {run.name} disk: {kept}", flush=True)  # to the run's log
    return {"run": run.name, "seconds": time.time() - start, "macro": results["macro"], "disk": disk}


def disk_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (each hard link once, symbolic links not followed)."""
    seen, total = set(), 0
    for path in folder.rglob("*"):
        st = path.lstat()
        if path.is_file() and not path.is_symlink() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _evaluate(cfg: CompareConfig, model: Path, output: Path) -> dict:
    """Held-out avg@n / pass@k of ``model`` on ``--eval-data`` or the embedded task's test split, with the prompts
    the runs trained on; the sample seeds depend on the problem and sample only, so every model of the comparison
    answers the same problems with the same seeds."""
    from kpo.evaluation import evaluate

    settings = engine_of(cfg).eval_settings(cfg)
    if cfg.eval_data:
        data = list(cfg.eval_data)
    else:  # the embedded task's test split, its prompts fed raw
        task = engine_of(cfg).embedded_task(cfg)
        data = "synthetic"
        settings = {
            "backend": settings["backend"],
            "synthetic_kw": {"kind": task.kind, "n_terms": task.n_terms, "max_value": task.max_value},
        }
    return evaluate(
        model,
        data,
        n=cfg.eval_n,
        ks=sorted({1, cfg.eval_n}),
        limit=cfg.eval_limit,
        output=output,
        show_progress=False,
        batch_size=64,
        **settings,
    )


def _evaluate_exact(cfg: CompareConfig, model: Path, output: Path) -> None:
    """Write ``output``: the exact expected accuracy of ``model`` on the held-out problems the sampled evaluation
    uses (:mod:`kpo.evaluation.expected`; one teacher-forced forward), per problem and per position. Only the
    running task has one right response per problem (:func:`kpo.compare.outcome.exact_applies`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kpo.evaluation.expected import expected_on_rows
    from kpo.testbed.task import load_split

    rows = load_split("test", n=cfg.eval_limit, task=engine_of(cfg).embedded_task(cfg))
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model)
    stats = expected_on_rows(net, tokenizer, rows)
    stats["ids"] = [r["id"] for r in rows]
    write_json(output, stats)  # a run counts as done once this file is there: whole or absent


def _done(cfg: CompareConfig, out: Path) -> bool:
    """Whether the run in ``out`` is finished: trained and scored (``eval.json``, and where the exact accuracy applies
    the file written after it)."""
    if not engine_of(cfg).trained(cfg, out):
        return False
    return (out / EVAL_FILE).exists() and (not exact_applies(cfg) or (out / EXPECTED_FILE).exists())


def _changed_settings(cfg: CompareConfig, run: Run, out: Path, problems: int) -> list[str]:
    """``"field: was -> now"`` for every setting of a done run that differs from what this compare would use."""
    changed = engine_of(cfg).changed(cfg, run, out)
    results = read_evaluation(out / EVAL_FILE)
    evaluated = sum(b["problems"] for b in results["benchmarks"].values())
    if results["params"]["n"] != cfg.eval_n:
        changed.append(f"eval_n: {results['params']['n']} -> {cfg.eval_n}")
    if evaluated != problems:
        changed.append(f"held-out problems: {evaluated} -> {problems} (--eval-limit, --eval-data)")
    return changed


def _stale_run_errors(cfg: CompareConfig, runs: list[Run], out: Path) -> list[str]:
    """One error per done run whose settings differ from this compare's, then how to proceed."""
    problems = held_out_problems(cfg, cfg.eval_limit)
    errors = []
    for run in runs:
        folder = out / "runs" / run.name
        if _done(cfg, folder) and (changed := _changed_settings(cfg, run, folder, problems)):
            errors.append(f"run {run.name} ({folder}) was made with other settings: {'; '.join(changed)}")
    if errors:
        errors.append(
            f"a compare reuses finished runs only with the same settings: use a new --out, or delete the run "
            f"directories above (under {out / 'runs'}) to retrain them, or rerun with their settings"
        )
    return errors


def _warm_start(cfg: CompareConfig, seed: int) -> None:
    """Worker: build one seed's start model (the cached warm start), before that seed's parallel runs could race
    to build it, and evaluate it (the Table 1 row every run starts from) unless that is done."""
    import torch

    torch.set_num_threads(1)
    path = engine_of(cfg).start_model(cfg, seed)
    folder = warm_start_dir(Path(cfg.out), seed)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / EVAL_FILE).exists():
        _evaluate(cfg, path, folder / EVAL_FILE)
    if exact_applies(cfg) and not (folder / EXPECTED_FILE).exists():
        _evaluate_exact(cfg, path, folder / EXPECTED_FILE)


def _share_start(cfg: CompareConfig, seed: int, first: int) -> None:
    """Seed ``seed`` starts from the model seed ``first`` started from: its start row is that evaluation."""
    source, folder = warm_start_dir(Path(cfg.out), first), warm_start_dir(Path(cfg.out), seed)
    for name in (EVAL_FILE, EXPECTED_FILE):
        if (source / name).exists() and not (folder / name).exists():
            with replacing(folder / name) as partial:
                shutil.copyfile(source / name, partial)


def _clear_unfinished(folder: Path, resume: bool) -> None:
    """Remove what an unfinished run left that would outlive its training: an evaluation of an older model (with
    the new run's metrics it would make a run that fails after training look done) and, unless it resumes, its
    partial metrics.jsonl (the progress bar would count its steps until the worker's --overwrite removed it; a
    resumed run keeps the rows up to its checkpoint)."""
    for name in (EVAL_FILE, EXPECTED_FILE) if resume else ("metrics.jsonl", EVAL_FILE, EXPECTED_FILE):
        (folder / name).unlink(missing_ok=True)


def _logsize_text(folder: Path) -> int:
    path = folder / "log.txt"
    return path.stat().st_size if path.exists() else -1


@dataclass(frozen=True, eq=False)
class Job:
    """A run of a comparison to train and evaluate: its compare's settings, the run, its folder, and the name
    progress lines give it."""

    cfg: CompareConfig
    run: Run
    folder: Path
    label: str


def _broken_pool_failures(broken: list[Job], started: list[Job]) -> list[str]:
    """What to say about the runs whose futures ended with BrokenProcessPool: a worker process died without an
    exception (a signal, out of memory, os._exit), and the pool stopped every other run with it. ``started``:
    those of them that had begun (their worker wrote to their log)."""
    lines = []
    if started:
        logs = ", ".join(str(j.folder / "log.txt") for j in started)
        who = (
            f"{started[0].run.name}: its worker process died"
            if len(started) == 1
            else f"{', '.join(j.run.name for j in started)}: the worker process of one of them died and the pool "
            "stopped the others"
        )
        lines.append(f"{who} (killed by a signal, out of memory, or os._exit; logs: {logs})")
    not_run = [j.run.name for j in broken if j not in started]
    if not_run:
        lines.append(
            f"not run, as the pool stopped when that worker died: {', '.join(not_run)} (rerun kpo compare to "
            "run them; finished runs are reused)"
        )
    return lines


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """kpo compare was interrupted: pass one SIGINT to each live worker, so its kpo train checkpoints and stops,
    cancel the runs not started, and return when every worker has ended."""
    for process in list(pool._processes.values()):  # the pool has no public handle on its workers
        if process.is_alive():
            os.kill(process.pid, signal.SIGINT)
    pool.shutdown(wait=True, cancel_futures=True)


def _await_runs(
    pool: ProcessPoolExecutor, jobs: list[Job], submit: Callable[[Job], object], on_done: Callable[[Job], None] | None
) -> tuple[list, list]:
    """Each seed's warm start, then every job through ``submit`` with a progress bar of optimizer steps, ``on_done``
    called as each finishes; returns (failure lines, jobs whose worker process died)."""
    from concurrent.futures.process import BrokenProcessPool

    warm = {}  # seed -> the settings of its first job (every job of a seed starts from one warm start)
    for job in jobs:
        warm.setdefault(job.run.seed, job.cfg)
    first = min(warm, default=0)
    # with a start model every seed shares (--model), it is evaluated once, for the first seed
    own = [seed for seed, cfg in sorted(warm.items()) if seed == first or not engine_of(cfg).shared_start(cfg)]
    print(f"start models of seeds {sorted(warm)} (warm starts: cached once built) and their evaluation", flush=True)
    for fut in [pool.submit(_warm_start, warm[seed], seed) for seed in own]:
        fut.result()
    for seed in sorted(set(warm) - set(own)):
        _share_start(warm[seed], seed, first)
    failures, broken = [], []
    with progress_bar(sum(j.cfg.steps for j in jobs), "compare", "optimizer steps") as bar:
        pending = {submit(j): j for j in jobs}
        while pending:
            finished, _ = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
            bar.n = sum(min(engine_of(j.cfg).steps_done(j.cfg, j.folder), j.cfg.steps) for j in jobs)
            bar.refresh()
            for fut in finished:
                job = pending.pop(fut)
                try:
                    info = fut.result()
                except BrokenProcessPool:
                    broken.append(job)
                    continue
                # SystemExit too: a run calling sys.exit is a failed run, not the end of kpo compare.
                except (Exception, SystemExit) as e:  # noqa: BLE001 - report every failed run, then stop
                    log = job.folder / "log.txt"
                    failures.append(f"{job.run.name}: {type(e).__name__}: {e} (traceback in its log: {log})")
                    continue
                macro = ", ".join(f"{k} {v:.3f}" for k, v in info["macro"].items() if "@" in k)
                disk = f"{size_text(info['disk']['written'])} written, {size_text(info['disk']['kept'])} kept"
                bar.write(f"done {job.label} in {info['seconds'] / 60:.1f} min: {macro}; disk {disk}")
                if on_done is not None:
                    on_done(job)
    return failures, broken


def _worker_start(parent: int) -> None:
    """A worker's own process group (signals reach it through :func:`_stop_workers` alone), its death with kpo
    compare's (:func:`die_with_parent`: in its own group, no terminal's signal reaches it), and SIGINT's
    default handler: a kpo compare started in the background (``&``, nohup) passes its ignored SIGINT on to the
    processes it spawns, and a worker that ignores it finished its run, however long, before stopping."""
    os.setpgrp()
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def train_jobs(jobs: list[Job], workers: int, on_done: Callable[[Job], None] | None = None) -> None:
    """Train and evaluate ``jobs`` in ``workers`` parallel worker processes, calling ``on_done(job)`` in this process
    as each finishes; :class:`RunsFailed` listing every failed run (after the others ended) when any failed,
    CompareError before anything starts when another process writes one of them (its lock). An interrupt is passed
    on to the workers (:func:`_stop_workers`)."""
    locked = [why for job in jobs if (why := busy(job.folder))]
    if locked:  # before anything is written to them
        raise CompareError(locked)
    log_sizes = {}  # a run's worker adds a line to its log at start: which of the runs a dead worker stopped had begun
    # Workers run in process groups of their own, so a signal reaches them only through _stop_workers: once,
    # whether it was a terminal's Ctrl-C (sent to the whole foreground group) or a signal to kpo compare alone.
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn"),
                               initializer=_worker_start, initargs=(os.getpid(),))

    def submit(job: Job):
        resume = engine_of(job.cfg).resumable(job.cfg, job.run, job.folder)
        if resume:
            print(f"resuming {job.label} from its checkpoint", flush=True)
        _clear_unfinished(job.folder, resume)
        log_sizes[job] = _logsize_text(job.folder)
        return pool.submit(_execute, job.cfg, job.run, job.folder, resume)

    with pool:
        try:
            failures, broken = _await_runs(pool, jobs, submit, on_done)
        except KeyboardInterrupt:
            _stop_workers(pool)
            raise
    broken.sort(key=jobs.index)  # in plan order, not in the order the pool gave up on them
    started = [j for j in broken if _logsize_text(j.folder) > log_sizes[j]]
    failures += _broken_pool_failures(broken, started)
    if failures:
        raise RunsFailed("kpo compare: runs failed:\n  " + "\n  ".join(failures))


def _design(plan: dict) -> tuple[int, dict[str, int]]:
    """What a plan fixes: its number of runs and the seeds of each contrast."""
    return plan["runs"], {name: c["seeds"] for name, c in plan["contrasts"].items()}


def _write_plan(path: Path, est: dict) -> None:
    """Write the plan unless ``path`` holds one of the same design: the planned half-widths are what was fixed
    before the runs, so a resumed or re-reported compare keeps them (a changed design gets a new plan)."""
    if path.exists() and _design(json.loads(path.read_text())) == _design(est):
        return
    write_json(path, est, indent=2)


def run_compare(cfg: CompareConfig, *, pilot: Path | None = None, plan_only: bool = False) -> Path | None:
    """Print the plan (runs, time, expected half-widths: from ``pilot``, a finished compare's report.json, or the
    stored prior), then run every missing run and write the report; returns the report's path (None with
    ``plan_only``, which stops after the plan). The plan is also written to ``plan.json`` before anything trains.

    Raises :class:`CompareError` before anything trains when a setting is invalid or a done run in ``cfg.out``
    was made with other settings.
    """
    cfg.validate()
    out = Path(cfg.out)
    runs = plan_runs(cfg)
    stale = _stale_run_errors(cfg, runs, out)
    if stale:
        raise CompareError(stale)
    todo = [r for r in runs if not _done(cfg, out / "runs" / r.name)]
    # the time per run: measured on this compare's finished runs, else on the pilot's
    pilots = [out / "runs" / r.name for r in runs if r not in todo]
    pilots += [] if pilot is None else sorted(Path(pilot).parent.glob("runs/*"))
    est = estimate(
        cfg,
        pilot_sd(pilot) if pilot is not None else DIFF_SD,
        done=len(runs) - len(todo),
        measured=measured_run_seconds(pilots),
    )
    print("\n".join([format_plan(cfg, est), *engine_of(cfg).plan_lines(cfg)]), flush=True)
    if plan_only:
        return None
    with holding(out, "kpo compare"):
        write_json(out / "compare.json", asdict(cfg), indent=2)
        _write_plan(out / "plan.json", est)
        print(f"kpo compare: {len(runs)} runs, {len(runs) - len(todo)} already done; report in {out}", flush=True)
        if todo:
            train_jobs([Job(cfg, r, out / "runs" / r.name, r.name) for r in todo], parallel_runs(cfg))
        return write_report(cfg, runs, out)
