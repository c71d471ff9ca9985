"""The run card (runs/<run>/README.md) and the zero-reward-variance warning, on seconds-long tiny runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kpo.train import run as run_module

pytestmark = pytest.mark.slow


def test_run_card_says_what_was_trained(tiny_config):
    """Every value in the card is this run's: the model's shape, the task, KPO's memory=matched with the q it
    resolves to, the protocol, steps and seed, the last-window metrics of metrics.jsonl, and the commands for
    the next steps; TRL's card (written at every checkpoint) never replaces it."""
    from kpo.filter.memory import matched_memory, q_for_memory
    from kpo.train import run_training

    config = tiny_config(
        "card", loss="kpo", loss_kwargs={"memory": "matched"}, max_steps=4, seed=3, save_steps=2
    )
    out = run_training(config)
    card = (out / "README.md").read_text()
    memory = matched_memory(config.task_config().max_response_chars())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    expected = [
        "# card: kpo on the embedded chain task",
        "seed 3, 4 of 4 optimizer steps",
        "hidden size 32, 1 layers, 2 heads",
        "embedded `chain` task, n_terms=2, max_value=4",
        f"memory=matched ({memory:.4g} tokens); filter q={q_for_memory(memory):.4g}, v=1, p0=0, x0=0, mask_mode=skip",
        "aggregation seq-mean-token-mean",
        "8 prompts x 4 generations = 32 responses per generation batch, 2 optimizer steps of 16 responses each "
        "(1 off-policy)",
        "learning rate 0.01 (AdamW, constant)",
        f"completion length up to {config.max_completion()} tokens, temperature 1",
        "## Final metrics (mean over the last 1 of 4 steps)",
        # 4 steps: the last window is step 4, the first step 1
        f"| reward (mean over responses) | {rows[3]['reward_mean']:.4g} |",
        f"| clip fraction (tokens) | {rows[3]['clip_frac']:.4g} |",
        f"| entropy (nats/token) | {rows[3]['entropy']:.4g} |",
        f"| reward over the first 1 steps | {rows[0]['reward_mean']:.4g} |",
        f"kpo eval --model {out}/final --data synthetic --task kind=chain --task n_terms=2 --task max_value=4 "
        f"--n 8 --k 1,8 --output {out}/eval.json",
        f"kpo eval --model {out}/warm_start ",
        f"kpo summary {out}",
    ]
    missing = [line for line in expected if line not in card]
    assert not missing, card
    assert "fine-tuned version" not in card and "GRPO" not in card.replace("GRPOTrainer", "")
    assert "stopped at step" not in card  # the run finished
    assert not list(out.glob("checkpoint-*/README.md"))  # and no TRL card beside the checkpoints


def test_a_crashed_run_keeps_kpos_card(tiny_config, monkeypatch):
    """TRL writes its card at every checkpoint; a run that crashes after one (here in batch 2, after checkpoint-2)
    is left with kpo's card of the steps done, not TRL's."""
    from kpo.train import run_training

    def crash(completions, **_):
        raise RuntimeError("reward server down")

    reward, calls = run_module.synthetic_reward, []
    monkeypatch.setattr(
        run_module,
        "synthetic_reward",
        lambda *a, **kw: calls.append(1) or (crash(*a, **kw) if len(calls) == 2 else reward(*a, **kw)),
    )
    config = tiny_config("crash", max_steps=4, save_steps=2)
    with pytest.raises(RuntimeError, match="reward server down"):
        run_training(config)
    card = (Path(config.output_dir) / "README.md").read_text()
    assert (
        card.startswith("# crash: kpo on the embedded chain task")
        and "(mean over the last 1 of 2 steps)" in card
    )


def test_run_card_of_a_stopped_run_says_how_to_continue(tiny_config, tmp_path):
    from kpo.train.card import run_card
    from kpo.train.checkpoints import mark_complete

    config = tiny_config("part", max_steps=8, loss="vanilla", dump_ratios_every=2)
    out = tmp_path / "part"
    out.mkdir()
    (out / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward_mean": s / 10}) + "\n" for s in range(1, 5))
    )
    # no checkpoint yet: --resume would find none to continue from
    assert f"`kpo train --config {out}/config.yaml --overwrite` carries it on" in run_card(config, out)
    (out / "checkpoint-4").mkdir()
    (out / "checkpoint-4" / "rng_state.pth").write_bytes(b"x")
    mark_complete(out / "checkpoint-4")
    card = run_card(config, out)
    assert "## Metrics so far (mean over the last 1 of 4 steps)" in card
    assert "| reward (mean over responses) | 0.4 |" in card and "| clip fraction (tokens) | n/a |" in card
    assert (
        f"The run stopped at step 4 of 8; `kpo train --config {out}/config.yaml --resume` carries it on"
        in card
    )
    assert "hyperparameters: none given" in card and "filter" not in card  # vanilla has no filter
    assert f"kpo analyze {out} --out {out}/analysis" in card


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_zero_reward_variance_is_said_once(tiny_config, monkeypatch, capsys, value):
    """A constant reward (every response wrong, as with a reward that never matches the output format, or every
    one right): all groups alike for 3 generation batches in a row (steps 1-6 of 2-step batches) gives one
    warning with the likely causes; the fourth such batch adds none."""
    from kpo.train import run_training

    monkeypatch.setattr(run_module, "synthetic_reward", lambda completions, **_: [value] * len(completions))
    config, scored = tiny_config("flat", max_steps=8), f"every response scored {value:g}"
    out = run_training(config)
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "zero reward variance" in line]
    assert len(warnings) == 1, err
    assert warnings[0].startswith(
        f"kpo train: warning: zero reward variance in every group for 3 generation batches in a row (steps 1-6; "
        f"{scored}): every advantage is 0, so the policy does not learn. Likely all responses are equally wrong or "
        f"right: the completion length ({config.max_completion()} tokens) too short"
    ), warnings[0]
    assert "--max-completion-length" in warnings[0]
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    assert all(r["frac_reward_zero_std"] == 1.0 for r in rows)


def test_no_warning_while_rewards_vary(tiny_config, capsys):
    from kpo.train import run_training

    run_training(tiny_config("varied", max_steps=6))
    assert "zero reward variance" not in capsys.readouterr().err


def test_run_card_says_how_rollouts_were_sampled(tiny_config, tmp_path):
    from kpo.train.card import run_card

    out = tmp_path / "card"
    out.mkdir()
    plain = run_card(tiny_config("card"), out)
    assert (
        "rollouts sampled in float32; the ratio's anchor: the trainer's log-probs; rollout correction: none"
        in plain
    )
    lagged = tiny_config(
        "card", rollout_dtype="bfloat16", rollout_lag=2, ratio_anchor="rollout", rollout_rs="token"
    )
    assert (
        "rollouts sampled in bfloat16, 2 generation batch(es) behind the trainer; the ratio's anchor: the sampler's "
        "log-probs (bypass); rollout correction: rollout_rs=token" in run_card(lagged, out)
    )
