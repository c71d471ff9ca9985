"""Running the confirmatory study (:mod:`kpo.compare.study`): register its plan, then train look by look to its
answer, resumably, from a committed plan only.

A study is two folders. ``STUDY`` (committed to git: ``docs/results/study``) holds ``plan.json`` (written once by
``--register``, never rewritten), ``seeds.json`` (the seeds admitted and dropped, in order), ``runs.json`` (one
record per finished run: its accuracy, its seed's warm start, its reward per generation batch, when it started)
and the report; ``RUNS`` (``runs/study``, not committed) holds the run folders, warm starts and logs. The records
are what the analysis reads, so a study continues on a machine without ``RUNS``: a recorded run is never trained
again. Every file is written whole or not at all (:func:`kpo._files.replacing`).
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kpo._files import replacing
from kpo.compare.plan import CompareError, Run, warm_start_dir
from kpo.compare.study import ARMS, analyze

__all__ = ["Study", "register", "run_study"]

PLAN, SEEDS, RECORDS = "plan.json", "seeds.json", "runs.json"
EXPLORATORY = Path("docs/results/regimes/report.json")  # the map the plan's simulation resamples


def _write_json(path: Path, value) -> None:
    with replacing(path) as partial:
        partial.write_text(json.dumps(value, indent=2) + "\n")


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise CompareError([f"{path}: {what} is not valid JSON ({e}); restore it from git (git checkout -- {path})"]) from None


def register(study: Path, exploratory: Path = EXPLORATORY, sims: int = 2000) -> Path:
    """Write ``study/plan.json`` (:func:`kpo.compare.study.design`, its simulation included) unless the folder
    already holds a plan: a plan is written once. Returns its path."""
    from kpo.compare.study import design

    path = Path(study) / PLAN
    if path.exists():
        raise CompareError([f"{path}: a plan is there already; a plan is written once (register in a new folder)"])
    found = _read_json(Path(exploratory), "the exploratory map's report")
    if found is None:
        raise CompareError([f"{exploratory}: no exploratory map report; the simulation resamples it (give --exploratory)"])
    plan = design(found, sims=sims)
    plan["registered"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, plan)
    return path


def plan_commit(study: Path) -> dict:
    """The git commit that added ``study/plan.json``: {"commit", "time" (epoch seconds), "clean" (the file on disk
    equals the committed one)}; {"commit": None, ...} where it is not committed (or git is not there)."""
    path = Path(study).resolve() / PLAN

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    found = git("log", "--diff-filter=A", "--format=%H %ct", "--", path.name).splitlines()
    if not found:
        return {"commit": None, "time": None, "clean": False}
    commit, when = found[-1].split()
    clean = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", path.name], cwd=path.parent, check=False
    ).returncode == 0
    return {"commit": commit, "time": int(when), "clean": clean}


@dataclass
class Study:
    """A study's folders: ``folder`` (plan, seeds, records, report), ``runs`` (run folders), and ``jobs`` (runs side
    by side; None = one per CPU). Every other setting is the plan's."""

    folder: Path
    runs: Path
    jobs: int | None = None

    def __post_init__(self) -> None:
        self.folder, self.runs = Path(self.folder), Path(self.runs)

    @functools.cached_property
    def plan(self) -> dict:
        """The plan, read once: it is never rewritten while a study runs."""
        plan = _read_json(self.folder / PLAN, "the plan")
        if not isinstance(plan, dict) or "questions" not in plan:
            raise CompareError([f"{self.folder / PLAN}: no study plan there; write one with --register"])
        return plan

    def seeds(self) -> dict:
        return _read_json(self.folder / SEEDS, "the seed list") or {"admitted": [], "warm": {}, "dropped": []}

    def records(self) -> dict:
        return _read_json(self.folder / RECORDS, "the run records") or {}

    @functools.cached_property
    def regimes(self):
        """The plan's cells as a regime map's, whose cell configs give every run its kpo train settings (checked
        once: validating every cell's compare parses kpo train's flags)."""
        from kpo.compare.regimes import RegimeConfig

        plan = self.plan
        cells = tuple(c for g in plan["groups"].values() for c in g["cells"])
        settings = {**plan["run_settings"], "train_args": tuple(plan["run_settings"]["train_args"])}
        return RegimeConfig(out=str(self.runs), cells_only=cells, jobs=self.jobs, **settings).validate()

    def data(self) -> dict:
        """The records as the analysis reads them: cell -> arm label -> seed -> (accuracy, warm start accuracy)."""
        out: dict = {}
        for r in self.records().values():
            out.setdefault(r["cell"], {}).setdefault(r["arm"], {})[r["seed"]] = (r["accuracy"], r["warm"])
        return out


def _run(label: str, seed: int) -> Run:
    method, kwargs = ARMS[label]
    return Run(method, seed, tuple(tuple(kv) for kv in kwargs))


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


def _reward_by_batch(folder: Path, depth: int) -> list[float]:
    """The run's mean training reward of each generation batch (metrics.jsonl's reward_mean over its steps)."""
    from kpo.train.metrics import load_metrics

    batches: dict[int, list[float]] = {}
    for row in load_metrics(folder):
        if row.get("reward_mean") is not None:
            batches.setdefault((row["step"] - 1) // depth, []).append(row["reward_mean"])
    return [sum(v) / len(v) for _, v in sorted(batches.items())]


def _record(study: Study, cell, label: str, seed: int, folder: Path) -> dict:
    from kpo.compare.outcome import load_outcome

    return {
        "cell": cell.name,
        "arm": label,
        "seed": seed,
        "accuracy": load_outcome(folder)["mean"],
        "warm": study.seeds()["warm"][str(seed)],
        "reward_by_batch": _reward_by_batch(folder, cell.depth),
        "started": _started(folder),
        "code": _code_commit(),
    }


@functools.cache
def _code_commit() -> str | None:
    """The commit of the checkout whose kpo trained the runs (a study runs from a worktree at a fixed commit, so
    every record of one session says the same), None outside git."""
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None


def _jobs(study: Study, answer: dict, admitted: list[int]) -> list:
    """The runs the next look needs that are not recorded: its groups' active arms on their first N seeds."""
    from kpo.compare.run import Job

    regimes, plan, done = study.regimes, study.plan, study.records()
    by_name = {c.name: c for c in regimes.cells}
    jobs = []
    for group, n in answer["next"].items():
        for seed in admitted[:n]:
            for cell_name in plan["groups"][group]["cells"]:
                cell = by_name[cell_name]
                for label in answer["active"].get(group, []):
                    run = _run(label, seed)
                    key = f"{cell.name}/{run.name}"
                    if key not in done:
                        cfg = regimes.cell_config(cell, 1)
                        jobs.append((cell, label, Job(cfg, run, study.runs / cell.name / "runs" / run.name, key)))
    return sorted(jobs, key=lambda j: (j[2].run.seed, j[0].name, j[1]))  # seed by seed: a partial study is balanced


def _admit(study: Study, wanted: int, build=None) -> list[int]:
    """Seeds until ``wanted`` are admitted: the next unused seeds from the plan's first, each warm start built and
    evaluated (``build(cfg, seeds)`` -> per seed None or why it failed its check; default: in parallel worker
    processes); a seed whose warm start fails its check is dropped (seeds.json says why) and the next unused seed
    tried. Returns the admitted seeds in order."""
    from kpo.compare.outcome import load_outcome

    build = build or _build_in_pool
    seeds = study.seeds()
    regimes = study.regimes
    cfg = regimes.cell_config(regimes.cells[0], 1)
    while len(seeds["admitted"]) < wanted:
        used = set(seeds["admitted"]) | {d["seed"] for d in seeds["dropped"]}
        candidates, seed = [], study.plan["first_seed"]
        while len(candidates) < wanted - len(seeds["admitted"]):
            if seed not in used:
                candidates.append(seed)
            seed += 1
        print(f"kpo compare study: warm starts of seeds {candidates} (built once, checked, evaluated)", flush=True)
        for s in candidates:
            _link_warm_start(study, regimes, s)
        for s, failure in zip(candidates, build(cfg, candidates)):
            if failure is None:
                seeds["admitted"].append(s)
                seeds["warm"][str(s)] = load_outcome(study.runs / f"warm_start-seed{s}")["mean"]
            else:
                seeds["dropped"].append({"seed": s, "reason": failure})
                print(f"kpo compare study: seed {s} dropped: {failure}", flush=True)
        seeds["admitted"].sort()
        _write_json(study.folder / SEEDS, seeds)
    return seeds["admitted"]


def _build_in_pool(cfg, candidates: list[int]) -> list[str | None]:
    """Each candidate seed's warm start built and evaluated in parallel worker processes, a line as each ends."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    from kpo.compare.plan import parallel_runs

    found: dict[int, str | None] = {}
    workers = min(parallel_runs(cfg), len(candidates))
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_build_warm_start, cfg, s): s for s in candidates}
        for done, future in enumerate(as_completed(futures), start=1):
            seed = futures[future]
            found[seed] = future.result()
            state = "ok" if found[seed] is None else "failed its check"
            print(f"kpo compare study: warm start of seed {seed} {state} ({done}/{len(candidates)})", flush=True)
    return [found[s] for s in candidates]


def _build_warm_start(cfg, seed: int) -> str | None:
    """Worker: build and evaluate seed ``seed``'s warm start; the reason it failed its check, or None."""
    from kpo.compare.run import _warm_start

    try:
        _warm_start(cfg, seed)
    except RuntimeError as e:
        if "failed its check" not in str(e):
            raise
        return str(e).split(". Nothing was cached")[0]
    return None


def _link_warm_start(study: Study, regimes, seed: int) -> None:
    """Every cell's warm-start folder of ``seed`` is a link to the study's one (one model, evaluated once)."""
    target = study.runs / f"warm_start-seed{seed}"
    target.mkdir(parents=True, exist_ok=True)
    for cell in regimes.cells:
        link = warm_start_dir(study.runs / cell.name, seed)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", target.name))


def _check_confirmatory(study: Study, allow_uncommitted: bool) -> dict:
    """The plan's commit; CompareError when the plan is not committed (or changed since), unless
    ``allow_uncommitted`` (the report then calls the study exploratory)."""
    found = plan_commit(study.folder)
    if (found["commit"] is None or not found["clean"]) and not allow_uncommitted:
        why = "is not committed" if found["commit"] is None else "differs from its committed version"
        raise CompareError(
            [
                f"{study.folder / PLAN} {why}: a confirmatory study runs from a committed plan. Commit it "
                f"(git add {study.folder / PLAN} && git commit) before the first run, or pass --allow-uncommitted "
                "for a study the report will call exploratory"
            ]
        )
    return found


def run_study(study: Study, *, report_only: bool = False, allow_uncommitted: bool = False) -> Path:
    """Train the study look by look until every question is answered or its looks are spent, recording each run
    as it finishes and rewriting the report at every step; ``report_only`` trains nothing. Returns report.md."""
    from kpo.compare.run import _done, train_jobs
    from kpo.compare.study_report import write_study_report

    plan = study.plan
    commit = plan_commit(study.folder) if report_only else _check_confirmatory(study, allow_uncommitted)
    _record_finished(study)
    while not report_only:
        admitted = study.seeds()["admitted"]
        answer = analyze(plan, study.data(), admitted)
        write_study_report(study, answer, commit)
        if answer["next"] is None:
            break
        admitted = _admit(study, max(answer["next"].values()))
        answer = analyze(plan, study.data(), admitted)
        planned = _jobs(study, answer, admitted)
        todo = [(c, label, j) for c, label, j in planned if not _done(j.cfg, j.folder)]
        print(
            f"kpo compare study: look {len(answer['looks']) + 1} at {answer['next']} seeds; arms "
            f"{answer['active']}; {len(planned)} runs to record, {len(todo)} to train",
            flush=True,
        )
        _record_finished(study)
        for seed in admitted:  # on a machine without RUNS, the warm starts of admitted seeds are rebuilt there
            _link_warm_start(study, study.regimes, seed)
        if todo:
            meta = {id(j): (c, label) for c, label, j in todo}

            def on_done(job, meta=meta) -> list:
                cell, label = meta[id(job)]
                _save_record(study, _record(study, cell, label, job.run.seed, job.folder))
                return []

            train_jobs([j for _, _, j in todo], study.jobs or None, on_done)
    answer = analyze(plan, study.data(), study.seeds()["admitted"])
    return write_study_report(study, answer, commit)


def _save_record(study: Study, record: dict) -> None:
    records = study.records()
    records[f"{record['cell']}/{_run(record['arm'], record['seed']).name}"] = record
    _write_json(study.folder / RECORDS, dict(sorted(records.items())))


def _record_finished(study: Study) -> None:
    """Record every finished run in ``RUNS`` that has no record yet (a stop between its end and its record)."""
    from kpo.compare.run import _done

    if not study.runs.exists():
        return
    regimes, done = study.regimes, study.records()
    for cell in regimes.cells:
        cfg = regimes.cell_config(cell, 1)
        for label in ARMS:
            for seed in study.seeds()["admitted"]:
                run = _run(label, seed)
                folder = study.runs / cell.name / "runs" / run.name
                if f"{cell.name}/{run.name}" not in done and folder.exists() and _done(cfg, folder):
                    _save_record(study, _record(study, cell, label, seed, folder))
