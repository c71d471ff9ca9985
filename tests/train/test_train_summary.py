"""kpo summary: summary.json from a run directory's metrics and its two evaluations (no training here)."""

from __future__ import annotations

import json

import pytest

from kpo.train.config import TrainConfig
from kpo.train.summary import main, summarize_run


def _eval(path, correct: list[int], n: int = 4) -> None:
    per_problem = [{"id": f"test-{i:06d}", "correct": c} for i, c in enumerate(correct)]
    avg = sum(correct) / (n * len(correct))
    path.write_text(
        json.dumps(
            {
                "params": {"n": n, "ks": [1, n]},
                "benchmarks": {
                    "synthetic": {
                        "problems": len(correct),
                        f"avg@{n}": avg,
                        f"pass@{n}": avg,
                        "per_problem": per_problem,
                    }
                },
            }
        )
    )


def _run(tmp_path, loss="kpo"):
    run = tmp_path / "run"
    run.mkdir()
    TrainConfig(output_dir=str(run), loss=loss, minibatches=4).save_yaml(run / "config.yaml")
    rows = []
    for step in range(1, 9):
        # steps 1 and 5 start a generation batch (on-policy, nothing clipped, filtered ratio 1)
        on = (step - 1) % 4 == 0
        rows.append(
            {
                "step": step,
                "reward_mean": 0.1 * step,
                "response_length": 128.0 + step % 2,
                "clip_frac": 0.0 if on else 0.01 * step,
                "filtered_ratio_min": 1.0 if on else 1.0 - 0.001 * step,
                "filtered_ratio_max": 1.0 if on else 1.0 + 0.002 * step,
            }
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 100 problems, 4 samples: the warm start gets 1 of 4 right on every problem, the final model 2 of 4
    _eval(run / "eval_warm_start.json", [1] * 100)
    _eval(run / "eval.json", [2] * 100)
    return run


def test_summary_numbers(tmp_path, capsys):
    run = _run(tmp_path)
    s = summarize_run(run)
    assert json.loads((run / "summary.json").read_text()) == s
    assert s["response_length_mean"] == 128.5
    assert s["warm_start"] == {
        "avg_at_k": 25.0,
        "pass_at_k": 25.0,
        "k": 4,
        "n_problems": 100,
        "ci95": [25.0, 25.0],
    }
    assert s["final"]["avg_at_k"] == 50.0 and s["final"]["ci95"] == [50.0, 50.0]
    # every problem gains 25 points: the paired interval cannot move
    assert s["final_minus_warm_start"] == {"mean": 25.0, "ci95": [25.0, 25.0]}
    # off-policy steps 2, 3, 4, 6, 7, 8: clip fractions 0.02..0.08, the largest excursion at step 8: 0.016
    assert s["kpo"]["off_policy_steps"] == 6
    assert s["kpo"]["clip_frac_mean"] == pytest.approx((0.02 + 0.03 + 0.04 + 0.06 + 0.07 + 0.08) / 6)
    assert s["kpo"]["filtered_ratio_abs_dev_max"] == pytest.approx(0.016)
    assert s["reward"] == {"first": pytest.approx(0.1), "last": pytest.approx(0.8)}
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| final | 50.0 [50.0, 50.0] | 50.0 | 100 |" in out and "+25.0 points" in out


def test_a_loss_without_a_filter_has_no_kpo_block(tmp_path):
    assert summarize_run(_run(tmp_path, loss="vanilla"))["kpo"] is None


def test_missing_evaluations_say_how_to_make_them(tmp_path, capsys):
    run = _run(tmp_path)
    (run / "eval_warm_start.json").unlink()
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert "no eval_warm_start.json" in err and f"kpo eval --model {run}/warm_start" in err


def test_overwrite_removes_the_previous_runs_evaluations_and_summary(tmp_path):
    from kpo.train.run import _prepare_output_dir

    run = _run(tmp_path)
    summarize_run(run)
    for name in ("eval.md", "eval.generations.jsonl", "eval_warm_start.generations.jsonl", "notes.txt"):
        (run / name).write_text("x")
    (run / "warm_start").mkdir()
    _prepare_output_dir(TrainConfig(output_dir=str(run), overwrite=True), run, world=1)
    # a stale evaluation would let kpo summary pair the new run with the old models' results
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_a_run_with_no_steps_logged_is_an_error_not_nan(tmp_path, capsys):
    """An empty metrics.jsonl (a full disk, a cut run) gave "0 steps, mean response nan" and a bare NaN in
    summary.json, which is not JSON."""
    run = _run(tmp_path)
    (run / "metrics.jsonl").write_text("")
    assert main([str(run)]) == 2
    assert capsys.readouterr().err.startswith(f"kpo summary: {run / 'metrics.jsonl'}: no steps logged")
    assert not (run / "summary.json").exists()


def test_a_torn_evaluation_is_named(tmp_path, capsys):
    run = _run(tmp_path)
    text = (run / "eval.json").read_text()
    (run / "eval.json").write_text(text[: len(text) // 2])
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kpo summary: {run / 'eval.json'}: not kpo eval's results (JSONDecodeError: ")
    assert err.rstrip().endswith(f"evaluate again with kpo eval --output {run / 'eval.json'}")


def test_summary_json_is_strict_json_without_response_lengths(tmp_path, capsys):
    run = _run(tmp_path)
    rows = [{"step": 1, "reward_mean": 0.5, "response_length": None}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(run)]) == 0
    assert "mean response n/a" in capsys.readouterr().out
    assert (
        json.loads((run / "summary.json").read_text(), parse_constant=pytest.fail)["response_length_mean"]
        is None
    )


@pytest.mark.parametrize("processes", [1, 2])
def test_a_run_stopped_after_a_checkpoint_is_finished_first(tmp_path, capsys, processes):
    """A run killed after its first checkpoint has no final/: the advice was kpo eval --model RUN/final."""
    from kpo.train.checkpoints import mark_complete

    run = _run(tmp_path)  # 8 steps of max_steps=1000
    (run / "eval.json").unlink()
    checkpoint = run / "checkpoint-8"
    checkpoint.mkdir()
    for rank in range(processes):
        (checkpoint / ("rng_state.pth" if processes == 1 else f"rng_state_{rank}.pth")).write_bytes(b"x")
    mark_complete(checkpoint)
    assert main([str(run)]) == 2
    train = "kpo train" if processes == 1 else "kpo launch --nproc-per-node 2 train"
    assert capsys.readouterr().err.startswith(
        f"kpo summary: {run}: no eval.json, and no final/ to evaluate: the run stopped at step 8 of 1000; finish it "
        f"with {train} --config {run}/config.yaml --resume, then evaluate with kpo eval --model {run}/final "
        "--data synthetic --task kind=running --task n_terms=128 --task max_value=9 --n 8 --k 1,8 --output "
        f"{run}/eval.json\n"
    )


def test_a_path_that_is_no_run_directory_is_named_so(tmp_path, capsys):
    """`kpo summary FILE` advised `kpo train --output-dir FILE`."""
    run = _run(tmp_path)
    assert main([str(run / "eval.json")]) == 2
    assert capsys.readouterr().err == (
        f"kpo summary: {run}/eval.json is a file, not a run directory; give the --output-dir of a kpo train run "
        f"(its folder is one: kpo summary {run})\n"
    )
    (tmp_path / "notes.txt").write_text("x")
    assert main([str(tmp_path / "notes.txt")]) == 2
    assert capsys.readouterr().err.endswith("give the --output-dir of a kpo train run\n")
    assert main([str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err == (
        f"kpo summary: {tmp_path}/absent: no such directory; give the --output-dir of a kpo train run\n"
    )
