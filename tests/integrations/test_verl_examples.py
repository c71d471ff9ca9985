"""examples/verl without verl: the data-prep script writes verl's RL schema from the shared files, the custom
reward grades with every accepted answer, and the launch scripts train with the strategy and the trainer that
verl's main_ppo is tested with here. (The launch scripts are checked against verl's own config validation in
test_verl_plugin.py.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pq = pytest.importorskip("pyarrow.parquet", reason="examples/verl/prepare_data.py needs pyarrow")

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("KPO_SHARED_DATA", ROOT.parent / "shared" / "data"))
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared benchmark data not found at {SHARED}")


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(
        f"verl_example_{name}", ROOT / "examples" / "verl" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_shared
def test_prepare_data_writes_verl_schema(tmp_path):
    prep = load_example("prepare_data")
    # Two small files instead of all seven (DAPO alone is 17917 rows): the same code path.
    for name, filename, n_rows in (
        ("aime24", "aime24.jsonl", 30),
        ("minerva", "minerva.deepscaler.json", 272),
    ):
        rows = prep.verl_rows(SHARED / filename, name, "test")
        path = tmp_path / f"{name}.parquet"
        pq.write_table(prep.pa.Table.from_pylist(rows), path)
        back = pq.read_table(path).to_pylist()
        assert len(back) == n_rows
        first = back[0]
        assert set(first) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert first["data_source"] == name and first["ability"] == "math"
        assert first["prompt"][0]["role"] == "user"
        assert first["prompt"][0]["content"].endswith("put your final answer within \\boxed{}.")
        assert first["reward_model"] == {"style": "rule", "ground_truth": first["extra_info"]["answers"][0]}
        assert [r["extra_info"]["index"] for r in back] == list(range(n_rows))
    # AIME24 problem 1's answer is 204 (the file's first row).
    aime = prep.verl_rows(SHARED / "aime24.jsonl", "aime24", "test")
    assert aime[0]["reward_model"]["ground_truth"] == "204"
    # deepscaler's Minerva lists alternatives for some answers: all of them are kept for the reward.
    minerva = prep.verl_rows(SHARED / "minerva.deepscaler.json", "minerva", "test")
    assert any(len(r["extra_info"]["answers"]) > 1 for r in minerva)


def test_prepare_data_refuses_missing_files(tmp_path, capsys):
    prep = load_example("prepare_data")
    assert prep.main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "dapo_math_17k.parquet" in capsys.readouterr().err


def test_reward_uses_every_accepted_answer():
    pytest.importorskip("math_verify", reason="kpo.rewards needs math-verify (pip install 'kpo[eval]')")
    reward = load_example("reward")
    good = "So the result is \\boxed{\\frac{1}{2}}."
    # verl passes extra_info lists read from parquet as numpy arrays.
    assert reward.compute_score("minerva", good, "0.4", {"answers": np.array(["0.4", "1/2"])}) == 1.0
    assert reward.compute_score("minerva", good, "0.4", {"answers": np.array(["0.4"])}) == 0.0
    assert reward.compute_score("aime24", good, "1/2", None) == 1.0
    assert reward.compute_score("aime24", "no final answer here", "1/2", {}) == 0.0


@pytest.mark.parametrize(
    "script, args, env",
    [("run_kpo_qwen3_4b.sh", [], {}), ("run_kpo_qwen3_4b_multinode.sh", ["train"], {"NNODES": "2"})],
)
def test_launch_scripts_train_as_tested(script, args, env):
    # FSDP2 and the v1 trainer are what tests/integrations/test_verl_e2e.py runs verl's trainer with (verl's
    # default FSDP1 cannot run on a CPU); the reference model's strategy follows the actor's in verl's config.
    out = subprocess.run(
        ["bash", str(ROOT / "examples" / "verl" / script), *args],
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    strategies = [line for line in out.stdout.splitlines() if ".strategy=" in line]
    assert strategies == ["actor_rollout_ref.actor.strategy=fsdp2"]
    assert [line for line in out.stdout.splitlines() if "use_v1" in line] == ["trainer.use_v1=True"]
