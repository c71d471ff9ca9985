"""Running a study: register its plan, then train look by look to its answer, resumably, from a committed plan
only, on any engine ``kpo compare`` runs.

A study is two folders. The study folder (committed to git) holds ``plan.json`` (written once by ``--register``,
never rewritten), ``seeds.json``, ``runs.json`` (:mod:`kpo.compare.study.records`) and the report; the runs
folder (not committed) holds the run folders, warm starts and logs. The records are what the analysis reads, so a
study continues on a machine without the runs folder: a recorded run is never trained again. Every file is
written whole or not at all, and one process at a time works on a study (its folder's lock, taken first).
"""

from __future__ import annotations

import functools
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from kpo._files import write_json
from kpo.compare.outcome import load_outcome
from kpo.compare.plan import CompareError, parallel_runs, share_warm_starts, shared_start_dir
from kpo.compare.run import Job, _done, holding
from kpo.compare.study.looks import analyze, nest, schedule
from kpo.compare.study.plan import PLAN_FILE, cell_arms, cell_config, load_plan, run_name, run_of
from kpo.compare.study.records import RECORDS, SEEDS, read_records, read_seeds
from kpo.compare.study.registration import plan_history
from kpo.compare.study.report import write_study_report
from kpo.train.metrics import load_metrics

__all__ = ["CLUSTER", "Study", "run_study"]

CLUSTER = ("ray_address", "ray_runtime_env")  # where a study's runs train: the invocation's settings, not the plan's


@dataclass
class Study:
    """A study's folders: ``folder`` (plan, seeds, records, report), ``runs`` (run folders), ``jobs`` (runs side by
    side; None = the engine's default) and ``cluster`` (:data:`CLUSTER`: the Ray cluster whose jobs the runs
    are, for the verl engine). Every other setting is the plan's."""

    folder: Path
    runs: Path
    jobs: int | None = None
    cluster: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder, self.runs = Path(self.folder), Path(self.runs)

    @functools.cached_property
    def plan(self) -> dict:
        """The plan, read and checked once: it is never rewritten while a study runs."""
        return load_plan(self.folder / PLAN_FILE)

    def seeds(self) -> dict:
        return read_seeds(self.folder, self.plan)

    def records(self) -> dict:
        return read_records(self.folder, self.plan, self.seeds())

    def data(self) -> dict:
        """The records as the analysis reads them: cell -> arm -> seed -> record."""
        return nest((r["cell"], r["arm"], r["seed"], r) for r in self.records().values())

    def job(self, cell: str, arm: str, seed: int) -> Job:
        cfg = cell_config(self.plan, cell, arm, self.runs)
        cfg.jobs = self.jobs
        for key, value in self.cluster.items():
            setattr(cfg, key, value)
        name = run_name(self.plan, arm, seed)
        return Job(cfg, run_of(self.plan, arm, seed), self.runs / cell / "runs" / name, f"{cell}/{name}")


# ------------------------------------------------------------------ records
def _started(folder: Path) -> float | None:
    """When the run in ``folder`` first started: the first start line its worker wrote to log.txt (epoch
    seconds), None without one."""
    log = folder / "log.txt"
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("=== kpo compare:") and " started " in line:
            return time.mktime(time.strptime(line.split(" started ")[1].rstrip(" ="), "%Y-%m-%d %H:%M:%S"))
    return None


def _by_batch(folder: Path, depth: int, key: str) -> list[float]:
    """The run's mean of metrics.jsonl's ``key`` over each generation batch's optimizer steps."""
    batches: dict[int, list[float]] = {}
    for row in load_metrics(folder):
        if row.get(key) is not None:
            batches.setdefault((row["step"] - 1) // depth, []).append(row[key])
    return [sum(v) / len(v) for _, v in sorted(batches.items())]


@functools.cache
def _code_commit() -> str | None:
    """The commit of the checkout whose kpo trained the runs (a study runs from a worktree at a fixed commit, so
    every record of one session says the same), None outside git."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None


def _record(study: Study, job: Job, cell: str, arm: str) -> dict:
    depth = study.plan["cells"][cell]["depth"]
    record = {
        "cell": cell,
        "arm": arm,
        "seed": job.run.seed,
        "accuracy": load_outcome(job.folder)["mean"],
        "warm": study.seeds()["warm"][str(job.run.seed)],
        "reward_by_batch": _by_batch(job.folder, depth, "reward_mean"),
        "started": _started(job.folder),
        "code": _code_commit(),
    }
    metrics = sorted({q["metric"] for q in study.plan["questions"] if q["outcome"] == "metric"})
    if metrics:
        record["metrics"] = {m: _by_batch(job.folder, depth, m)[-1] for m in metrics}
    return record


def _save_record(study: Study, record: dict) -> None:
    records = study.records()
    records[f"{record['cell']}/{run_name(study.plan, record['arm'], record['seed'])}"] = record
    write_json(study.folder / RECORDS, dict(sorted(records.items())), indent=2)


def _record_finished(study: Study) -> None:
    """Record every finished run that has no record yet (a stop between its end and its record)."""
    if not study.runs.exists():
        return
    done = study.records()
    for cell, arm in cell_arms(study.plan):
        for seed in study.seeds()["admitted"]:
            job = study.job(cell, arm, seed)
            if job.label not in done and job.folder.exists() and _done(job.cfg, job.folder):
                _save_record(study, _record(study, job, cell, arm))


# ------------------------------------------------------------------ seeds
def _admit(study: Study, wanted: int, build=None) -> list[int]:
    """Seeds until ``wanted`` are admitted: the next unused seeds from the plan's first, each start model built and
    evaluated (``build(cfg, seeds)`` -> per seed None or why it failed its check; default: in parallel worker
    processes); a seed whose warm start fails its check is dropped (seeds.json says why) and the next unused seed
    tried. Returns the admitted seeds in order."""
    build = build or _build_in_pool
    seeds = study.seeds()
    cell, arm = next(cell_arms(study.plan))
    cfg = study.job(cell, arm, 0).cfg
    while len(seeds["admitted"]) < wanted:
        used = set(seeds["admitted"]) | {d["seed"] for d in seeds["dropped"]}
        candidates, seed = [], study.plan["seeds"]["first"]
        while len(candidates) < wanted - len(seeds["admitted"]):
            if seed not in used:
                candidates.append(seed)
            seed += 1
        print(f"kpo compare study: start models of seeds {candidates} (built once, checked, evaluated)", flush=True)
        share_warm_starts(study.runs, study.plan["cells"], candidates)
        for s, failure in zip(candidates, build(cfg, candidates)):
            if failure is None:
                seeds["admitted"].append(s)
                seeds["warm"][str(s)] = load_outcome(shared_start_dir(study.runs, s))["mean"]
            else:
                seeds["dropped"].append({"seed": s, "reason": failure})
                print(f"kpo compare study: seed {s} dropped: {failure}", flush=True)
        seeds["admitted"].sort()
        write_json(study.folder / SEEDS, seeds, indent=2)
    return seeds["admitted"]


def _build_in_pool(cfg, candidates: list[int]) -> list[str | None]:
    """Each candidate seed's start model built and evaluated in parallel worker processes, a line as each ends."""
    from kpo.compare.run import get_context  # the context of kpo compare's own workers (a test patches it)

    found: dict[int, str | None] = {}
    with ProcessPoolExecutor(max_workers=min(parallel_runs(cfg), len(candidates)), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_build_warm_start, cfg, s): s for s in candidates}
        for done, future in enumerate(as_completed(futures), start=1):
            seed = futures[future]
            found[seed] = future.result()
            state = "ok" if found[seed] is None else "failed its check"
            print(f"kpo compare study: start model of seed {seed} {state} ({done}/{len(candidates)})", flush=True)
    return [found[s] for s in candidates]


def _build_warm_start(cfg, seed: int) -> str | None:
    """Worker: build and evaluate seed ``seed``'s start model; the reason it failed its check, or None."""
    from kpo.compare.run import _warm_start

    try:
        _warm_start(cfg, seed)
    except RuntimeError as e:
        if "failed its check" not in str(e):
            raise
        return str(e).split(". Nothing was cached")[0]
    return None


# ------------------------------------------------------------------ the study
def _jobs(study: Study, answer: dict, admitted: list[int]) -> list[tuple[str, str, Job]]:
    """The runs the next looks need that are not recorded: each waiting group's active arms on its first N seeds,
    seed by seed (a partial study is balanced)."""
    done, jobs = study.records(), []
    for group, n in answer["next"].items():
        for seed in admitted[:n]:
            for cell in study.plan["groups"][group]["cells"]:
                for arm in answer["active"][group]:
                    job = study.job(cell, arm, seed)
                    if job.label not in done:
                        jobs.append((cell, arm, job))
    return sorted(jobs, key=lambda j: (j[2].run.seed, j[0], j[1]))


def _check_registration(study: Study, history: dict, allow_uncommitted: bool) -> None:
    """A study trains only from its plan as first committed, with no run started before that commit, unless
    ``allow_uncommitted`` (the report then calls it exploratory); a plan changed after it was committed never."""
    path = study.folder / PLAN_FILE
    if history["changed"] and (history["first"] is not None and study.records()):
        raise CompareError([f"{path} {history['changed']} after its runs began: a changed plan is a new study; register "
                            "it in a new folder (git checkout the first version to continue this one)"])
    if (history["first"] is None or history["changed"]) and not allow_uncommitted:
        why = "is not committed" if history["first"] is None else history["changed"]
        raise CompareError([f"{path} {why}: a confirmatory study runs from its committed plan. Commit it "
                            f"(git add {path} && git commit) before the first run, or pass --allow-uncommitted for a "
                            "study the report will call exploratory"])


def run_study(study: Study, *, report_only: bool = False, allow_uncommitted: bool = False) -> Path:
    """Train the study look by look until every question is answered or its looks are spent, recording each run
    as it finishes and rewriting the report at every step; ``report_only`` trains nothing. Returns report.md.
    The study folder's lock is taken before anything else (CompareError when another process holds it)."""
    if not (study.folder / PLAN_FILE).exists():
        raise CompareError([f"{study.folder / PLAN_FILE}: no plan there; register one (kpo compare study --plan FILE "
                            "--register)"])
    with holding(study.folder, "kpo compare study"):
        return _run_locked(study, report_only, allow_uncommitted)


def _run_locked(study: Study, report_only: bool, allow_uncommitted: bool) -> Path:
    from kpo.compare.run import train_jobs  # a test patches it

    plan, history = study.plan, plan_history(study.folder)
    if not report_only:
        _check_registration(study, history, allow_uncommitted)
        _record_finished(study)
    last = None
    while not report_only:
        answer = analyze(plan, study.data(), study.seeds()["admitted"])
        write_study_report(study, answer, history)
        if answer["next"] is None:
            break
        admitted = _admit(study, max(answer["next"].values()))
        answer = analyze(plan, study.data(), admitted)
        if answer["next"] is None:
            continue
        planned = _jobs(study, answer, admitted)
        todo = [(c, a, j) for c, a, j in planned if not _done(j.cfg, j.folder)]
        looks = ", ".join(f"{g} at {n} of {schedule(plan, g)[-1]} seeds" for g, n in answer["next"].items())
        print(f"kpo compare study: next looks: {looks}; {len(planned)} runs to record, {len(todo)} to train", flush=True)
        _record_finished(study)
        if (looks, len(study.records())) == last:  # nothing recorded since the last pass: it would loop for ever
            raise CompareError([f"kpo compare study: the next looks ({looks}) need runs that were trained but not "
                                f"recorded; see their logs under {study.runs}"])
        last = (looks, len(study.records()))
        # on a machine without the runs folder, admitted seeds' warm starts are rebuilt there
        share_warm_starts(study.runs, plan["cells"], admitted)
        if todo:
            meta = {id(j): (c, a) for c, a, j in todo}

            def on_done(job, meta=meta) -> None:
                _save_record(study, _record(study, job, *meta[id(job)]))

            train_jobs([j for _, _, j in todo], parallel_runs(todo[0][2].cfg), on_done)
    answer = analyze(plan, study.data(), study.seeds()["admitted"])
    return write_study_report(study, answer, history)
