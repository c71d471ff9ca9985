"""``kpo train``: the paper's RL protocol on TRL's GRPOTrainer with kpo's losses.

    from kpo.train import TrainConfig, run_training
    out = run_training(TrainConfig(loss="kpo", max_steps=40, output_dir="runs/demo"))

A run's output_dir holds ``config.yaml``, ``metrics.jsonl`` (one row per optimizer step: step, reward_mean,
reward_std, entropy, clip_frac, pg_loss, ppo_kl, response_length, step_time and the loss's own metrics),
``checkpoint-*``, ``final/`` (model + tokenizer, ``from_pretrained``-ready), ``training_dynamics.png``,
TensorBoard logs under ``runs/``, and with ``dump_ratios_every`` ``ratios/step_{N:06d}.safetensors``.
Attributes load on first use so ``import kpo.train`` does not import TRL.
"""

from __future__ import annotations

from kpo._lazy import lazy_getattr

_EXPORTS = {
    "TrainConfig": "kpo.train.config",
    "ConfigError": "kpo.train.config",
    "run_training": "kpo.train.run",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr("kpo.train", _EXPORTS, globals())
