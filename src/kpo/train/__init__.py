"""``kpo train``: the paper's RL protocol on TRL's GRPOTrainer with kpo's losses; and that trainer in a TRL script.

    from kpo.train import TrainConfig, run_training
    out = run_training(TrainConfig(loss="kpo", max_steps=40, output_dir="runs/demo"))

    from kpo.train import KPOConfig, KPOTrainer  # a TRL script's GRPOConfig and GRPOTrainer, with kpo's settings
    KPOTrainer(model, reward_funcs, args=KPOConfig(output_dir="runs/x", loss="kpo"), train_dataset=data).train()

A run's output_dir holds ``config.yaml``, ``metrics.jsonl`` (one row per optimizer step: step, reward_mean,
reward_std, entropy, clip_frac, pg_loss, ppo_kl, response_length, step_time, world_size and the loss's own
metrics), ``checkpoint-*``, ``final/`` (model + tokenizer, ``from_pretrained``-ready), ``training_dynamics.png``,
TensorBoard logs under ``runs/``, and with ``dump_ratios_every`` ``ratios/step_{N:06d}.safetensors``.
Attributes load on first use so ``import kpo.train`` does not import TRL.

Reading map: one optimizer step, from the prompt to the metrics row.

1. ``run.run_training`` resolves the :class:`TrainConfig` (``config``), loads the prompts (``run._load_data``: the
   embedded task of ``kpo.testbed.task`` or a math dataset), the model (``kpo.train.warm_start``, cached, or
   ``--model``) and builds ``trainer.KPOTrainer`` with its ``KPOConfig`` (``trainer_config``).
2. Once per generation batch (every ``minibatches`` optimizer steps) TRL's ``_prepare_inputs`` samples
   ``num_generations`` completions per prompt, scores them with ``run.synthetic_reward`` or
   ``run.math_reward_fn``, and computes the old log-probs once; ``KPOTrainer._generate_and_score_completions``
   replaces TRL's advantages with ``kpo.compute_advantages`` and ``_annotate_global_counts`` gives each
   micro-batch its mini-batch's sequence and token counts.
3. Per micro-batch, ``KPOTrainer._compute_loss``: TRL's forward gives log-probs and entropies, and
   ``kpo.policy_loss`` (the registry in ``kpo.losses``; KPO filters the log-ratio with ``kpo.kalman_filter``)
   gives the loss and its metrics. Every ``dump_ratios_every`` steps ``_maybe_dump`` writes the step's ratios
   (``kpo.analysis.dumps.write_dump``). Only the first optimizer step of a generation batch is on-policy.
4. After the mini-batch's micro-batches the optimizer steps; ``KPOTrainer.log`` combines the micro-batches'
   metrics (``trainer._combine``), carries the generation batch's reward statistics, and ``_write_row`` appends
   one row to ``metrics.jsonl``; ``progress`` prints a line, ``plots`` draws ``training_dynamics.png`` at the end.
"""

from __future__ import annotations

from kpo._lazy import lazy_getattr

_EXPORTS = {
    "TrainConfig": "kpo.train.config",
    "ConfigError": "kpo.train.settings",
    "run_training": "kpo.train.run",
    "KPOConfig": "kpo.train.trainer_config",
    "KPOTrainer": "kpo.train.trainer",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr("kpo.train", _EXPORTS, globals())
