"""``kpo summary RUN_DIR``: one run's headline numbers in ``summary.json`` and a short table.

It reads what ``kpo train`` and ``kpo eval`` left in the run directory: ``metrics.jsonl``, ``config.yaml``, and
the evaluations of the model the run started from (``eval_warm_start.json``) and of its final model
(``eval.json``), both on the same held-out problems. Each avg@k carries a 95% percentile-bootstrap interval over
problems, and the change from the warm start a paired one (:func:`kpo.evaluation.metrics.paired_diff_ci` with one
seed: a t-interval over the problems' paired differences, which covers the evaluation's noise, not another seed's).

``summary.json`` keys: ``run``, ``loss``, ``steps``, ``response_length_mean`` (mean sampled response length over
the training steps), ``reward`` (first/last: mean training reward over the first/last 10% of steps),
``warm_start`` and ``final`` (``avg_at_k``, ``pass_at_k``, ``k``, ``n_problems``, ``ci95``: percentages),
``final_minus_warm_start`` (``mean``, ``ci95``: percentage points), and ``kpo`` for a Kalman loss
(``clip_frac_mean`` over the off-policy steps, ``filtered_ratio_abs_dev_max``: the largest |filtered ratio - 1|
over them, ``off_policy_steps``) or None for another loss.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from kpo._files import replacing
from kpo.protocol import on_policy_step
from kpo.train.checkpoints import continue_command
from kpo.train.config import TrainConfig
from kpo.train.metrics import load_metrics, window_mean

__all__ = ["EVAL_FILES", "summarize_run", "main"]

# run-dir files of the two evaluations the summary compares
EVAL_FILES = {"warm_start": "eval_warm_start.json", "final": "eval.json"}


def _eval_block(path: Path) -> tuple[dict, list[int], int]:
    """(summary block, per-problem correct counts, n) of an eval results file with one benchmark."""
    from kpo.evaluation.metrics import bootstrap_avg_ci

    try:
        results = json.loads(path.read_text())
        benches = results["benchmarks"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: not kpo eval's results ({type(e).__name__}: {e}); evaluate again with kpo eval --output {path}"
        ) from None
    if len(benches) != 1:
        raise ValueError(
            f"{path}: holds {len(benches)} benchmarks ({', '.join(benches)}); the summary reads one"
        )
    bench = next(iter(benches.values()))
    n = results["params"]["n"]
    counts = [p["correct"] for p in bench["per_problem"]]
    low, high = bootstrap_avg_ci([counts], n)
    block = {
        "avg_at_k": 100 * bench[f"avg@{n}"],
        "pass_at_k": 100 * bench[f"pass@{n}"] if f"pass@{n}" in bench else None,
        "k": n,
        "n_problems": bench["problems"],
        "ci95": [100 * low, 100 * high],
    }
    return block, counts, n


def _kalman_block(rows: list[dict], minibatches: int) -> dict:
    """Clip fraction and filtered-ratio excursion over the off-policy steps (all but the first of each
    generation batch)."""
    off = [r for r in rows if not on_policy_step(r["step"], minibatches)]
    devs = [
        max(r["filtered_ratio_max"] - 1, 1 - r["filtered_ratio_min"])
        for r in off
        if r.get("filtered_ratio_max") is not None and r.get("filtered_ratio_min") is not None
    ]
    clips = [r["clip_frac"] for r in off if r.get("clip_frac") is not None]
    return {
        "clip_frac_mean": sum(clips) / len(clips) if clips else None,
        "filtered_ratio_abs_dev_max": max(devs) if devs else None,
        "off_policy_steps": len(off),
    }


def eval_command(config: TrainConfig, run: Path, which: str) -> str:
    """The ``kpo eval`` that writes evaluation ``which`` (a key of :data:`EVAL_FILES`) of the run ``config`` in
    ``run``: of final/, or of the model it started from, on the run's task (a benchmark file with --dataset)."""
    quoted = shlex.quote(str(run))
    if config.dataset is None:
        task = config.task_config()
        data = (
            f"--data synthetic --task kind={task.kind} --task n_terms={task.n_terms} "
            f"--task max_value={task.max_value} --n 8 --k 1,8"
        )
    else:
        data = f"--data BENCHMARK.jsonl --n 16 --k 1,16 --max-new-tokens {config.max_completion()}"
    start = f"{quoted}/warm_start" if config.model is None else shlex.quote(config.model)
    model = f"{quoted}/final" if which == "final" else start
    return f"kpo eval --model {model} {data} --output {quoted}/{EVAL_FILES[which]}"


def _not_a_run(path: Path) -> str:
    """Why ``path``, no directory, has no run to summarize, and what to give instead."""
    if not path.exists():
        return f"{path}: no such directory; give the --output-dir of a kpo train run"
    folder = path.parent
    hint = (
        f" (its folder is one: kpo summary {shlex.quote(str(folder))})"
        if (folder / "config.yaml").is_file()
        else ""
    )
    return f"{path} is a file, not a run directory; give the --output-dir of a kpo train run{hint}"


def _evaluate_first(config: TrainConfig, run: Path, unevaluated: list[str], steps: int) -> str:
    """What to run before the summary: the evaluations ``unevaluated`` (keys of :data:`EVAL_FILES`), and first,
    where the final model is one of them and the run wrote none (it stopped early), the command that finishes it."""
    files = ", ".join(EVAL_FILES[key] for key in unevaluated)
    evaluate = " and ".join(eval_command(config, run, key) for key in unevaluated)
    if "final" in unevaluated and not (run / "final").is_dir():
        return (
            f"{run}: no {files}, and no final/ to evaluate: the run stopped at step {steps} of {config.max_steps}; "
            f"finish it with {continue_command(run)}, then evaluate with {evaluate}"
        )
    return f"{run}: no {files}; evaluate with {evaluate}"


def summarize_run(run_dir: str | Path) -> dict:
    """The summary of ``run_dir`` (see the module docstring); writes ``summary.json`` there and returns it."""
    from kpo.evaluation.metrics import paired_diff_ci
    from kpo.losses.kpo import KALMAN_LOSSES

    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(_not_a_run(run))
    missing = [name for name in ("config.yaml", "metrics.jsonl") if not (run / name).exists()]
    if missing:
        raise FileNotFoundError(
            f"{run}: no {', '.join(missing)}, so no kpo train run is there; give the --output-dir of one (kpo "
            f"train --output-dir {shlex.quote(str(run))} trains one there)"
        )
    config = TrainConfig.from_yaml(run / "config.yaml")
    rows = load_metrics(run)
    if not rows:
        raise ValueError(
            f"{run / 'metrics.jsonl'}: no steps logged, so there is nothing to summarize; it is written during "
            f"training: carry the run on with {continue_command(run)}"
        )
    unevaluated = [key for key, name in EVAL_FILES.items() if not (run / name).exists()]
    if unevaluated:
        raise FileNotFoundError(_evaluate_first(config, run, unevaluated, len(rows)))
    evals = {key: _eval_block(run / name) for key, name in EVAL_FILES.items()}
    (warm, warm_counts, n_warm), (final, final_counts, n_final) = evals["warm_start"], evals["final"]
    if n_warm != n_final or len(warm_counts) != len(final_counts):
        raise ValueError(
            f"{run}: the two evaluations differ in samples or problems; evaluate both the same way"
        )
    diff, low, high = paired_diff_ci([final_counts], [warm_counts], n_final)
    lengths = [r["response_length"] for r in rows if r.get("response_length") is not None]
    rewards = [r.get("reward_mean") for r in rows]
    summary = {
        "run": str(run),
        "loss": config.loss,
        "steps": len(rows),
        "response_length_mean": sum(lengths) / len(lengths) if lengths else None,
        "reward": {"first": window_mean(rewards, last=False), "last": window_mean(rewards, last=True)},
        "warm_start": warm,
        "final": final,
        "final_minus_warm_start": {"mean": 100 * diff, "ci95": [100 * low, 100 * high]},
        "kpo": _kalman_block(rows, config.minibatches) if config.loss in KALMAN_LOSSES else None,
    }
    with replacing(run / "summary.json") as partial:
        partial.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


def format_summary(s: dict) -> str:
    k = s["final"]["k"]
    length = s["response_length_mean"]
    lines = [
        f"run {s['run']}: {s['loss']}, {s['steps']} steps, mean response "
        + ("n/a" if length is None else f"{length:.1f} tokens"),
        f"| model | avg@{k} (95% CI) | pass@{k} | problems |",
        "|---|---|---|---|",
    ]
    for key in ("warm_start", "final"):
        b = s[key]
        pass_k = "-" if b["pass_at_k"] is None else f"{b['pass_at_k']:.1f}"
        lines.append(
            f"| {key} | {b['avg_at_k']:.1f} [{b['ci95'][0]:.1f}, {b['ci95'][1]:.1f}] | {pass_k} | "
            f"{b['n_problems']} |"
        )
    d = s["final_minus_warm_start"]
    lines.append(
        f"final - warm start: {d['mean']:+.1f} points, 95% CI [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] "
        "(paired over problems; one seed)"
    )
    if s["kpo"] is not None:
        kb = s["kpo"]
        clip = "n/a" if kb["clip_frac_mean"] is None else f"{kb['clip_frac_mean']:.4f}"
        dev = "n/a" if kb["filtered_ratio_abs_dev_max"] is None else f"{kb['filtered_ratio_abs_dev_max']:.2e}"
        lines.append(
            f"KPO filter on {kb['off_policy_steps']} off-policy steps: clip fraction {clip}, "
            f"max |filtered ratio - 1| {dev}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kpo summary",
        description="Write RUN_DIR/summary.json (warm start vs final avg@k with 95%% intervals, response length, "
        "KPO's clip fraction and filtered-ratio excursion) from kpo train's and kpo eval's outputs, and print it.",
    )
    parser.add_argument("run_dir", help="a kpo train --output-dir holding eval_warm_start.json and eval.json")
    args = parser.parse_args(argv)
    try:
        summary = summarize_run(args.run_dir)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"kpo summary: {e}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    print(f"summary: {Path(args.run_dir) / 'summary.json'}")
    return 0
