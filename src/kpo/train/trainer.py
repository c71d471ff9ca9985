"""TRL's GRPOTrainer with its loss, advantages and logging taken from kpo.

What is replaced (TRL has no loss plugin API, so this pins the TRL range it was tested on):

- ``_compute_loss``: log-probs and entropies from TRL's own forward, then ``kpo.policy_loss(name, ...)``
  with the mini-batch's global sequence/token counts, so the loss of an accumulated mini-batch equals the loss
  of the whole mini-batch in one piece. Old log-probs are the ones TRL computes once per generation batch
  (``steps_per_generation > gradient_accumulation_steps``), so every optimizer step after the first of a
  generation batch is off-policy, as in the paper's protocol.
- ``_generate_single_turn``: rollouts sampled by kpo's decoder (``kpo.train.rollout``) where it applies, TRL's
  ``generate`` otherwise; the decoder samples the rollout sampler's model (``kpo.train.sampler``: the policy, or
  its copy in bf16/FP8) and keeps its per-token log-probs.
- the train-inference mismatch: every generation batch the sampler's log-probs are set against the trainer's
  (``rollout_corr/*`` in metrics.jsonl, verl's names); the PPO anchor (``old_log_prob``) is the trainer's
  recomputed log-probs (``ratio_anchor="trainer"``, verl's decoupled mode; TIS/MIS/rejection weights
  ``pi_trainer / pi_sampler`` from ``rollout_correction``) or the sampler's (``"rollout"``, verl's bypass mode:
  the first step of a batch is then off-policy by the mismatch, and rejection is decided on ``pi_theta /
  pi_sampler`` as verl's bypass does).
- ``_generate_and_score_completions``: advantages recomputed with ``kpo.compute_advantages`` from the rewards
  TRL just scored (TRL's own estimator differs in eps and options).
- ``log``: one row per optimizer step appended to ``metrics.jsonl`` with the paper's names; generation-batch
  statistics (reward, response length) are carried to every optimizer step trained on that batch.

- ``memory="auto"`` (KPO's fitted q): every micro-batch of an optimizer step, on every process, is the fixed-q
  loss at the step's q, and the step's last micro-batch fits the next step's q to all of the step's log-ratios,
  summed over processes (``kpo.filter.fit.StepFit``); logged as ``kpo/q`` etc., kept in checkpoints.

- ``create_model_card``: kpo's run card (``kpo.train.card``) instead of TRL's, which TRL writes to
  ``output_dir/README.md`` at every checkpoint.

With an :class:`~kpo.train.interrupt.InterruptGuard`, SIGINT/SIGTERM stop the run at a generation-batch boundary
(see that module); without one, it trains through. If every group's rewards are equal for
``FLAT_REWARD_BATCHES`` generation batches in a row, it says so once (nothing can be learned from them).

Optionally every ``dump_ratios_every`` optimizer steps the per-token log-ratio, its Kalman-filtered version
and the mask are saved to ``ratios/step_{N:06d}.safetensors`` for ``kpo analyze``.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import trl
from packaging.version import Version
from safetensors.torch import load_file, save_file

from kpo._files import writing
from kpo.advantages import compute_advantages
from kpo.analysis.dumps import write_dump
from kpo.filter.memory import matched_memory, q_for_memory
from kpo.losses import aggregate_entropy, get_loss_spec, policy_loss, rollout_correction
from kpo.losses.kpo import add_to_fit, filter_settings, fits_memory, fixed_q_kwargs, step_fit
from kpo.protocol import on_policy_step
from kpo.train.checkpoints import incomplete_reason, save_whole
from kpo.train.interrupt import InterruptGuard, restore_rng, rng_state
from kpo.train.rollout import fast_rollout_unsupported, generate_single_turn
from kpo.train.sampler import MISMATCH_METRICS, RolloutSampler, mismatch_metrics, mismatch_sums
from kpo.train.trainer_config import trainer_args

TESTED_TRL = (Version("1.16"), Version("1.17"))
if not TESTED_TRL[0] <= Version(trl.__version__) < TESTED_TRL[1]:
    raise ImportError(
        f"kpo.train was written against TRL >=1.16,<1.17 (it overrides GRPOTrainer internals), found TRL "
        f"{trl.__version__}: pip install 'trl>=1.16,<1.17'"
    )

from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import RepeatSampler  # noqa: E402

__all__ = ["FLAT_REWARD_BATCHES", "KPOTrainer"]
# Generation batches in a row whose groups all have zero reward variance before the run says nothing can learn
# (one such batch happens by chance when the reward is rare; several in a row rarely do).
FLAT_REWARD_BATCHES = 3
# Generation-batch statistics TRL logs once per generation; carried to the other optimizer steps.
# The sampling/ keys are vLLM's train/inference mismatch (TRL's importance-sampling correction).
_SAMPLING_KEYS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)
# The sampler's mismatch (kpo.train.sampler), measured once per generation batch, and the clip fraction of the
# batch's first (on-policy) optimizer step: above 0 only where the mismatch reaches the ratio.
SAMPLER_FILE = "rollout_sampler.safetensors"  # a checkpoint's lagging-sampler weights (kpo.train.sampler)
MEMORY_FIT_FILE = "memory_fit.json"  # a checkpoint's fitted q for the next step (memory="auto")
_MISMATCH_KEYS = (*(f"rollout_corr/{k}" for k in MISMATCH_METRICS), "rollout_corr/on_policy_clip_frac")
_GENERATION_KEYS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    *_SAMPLING_KEYS,
    *_MISMATCH_KEYS,
)


def _combine(key: str, pairs: list[tuple[float, float]], processes: int = 1) -> float:
    """One optimizer step's value of a loss metric from its micro-batches' (value, valid tokens), those of all
    ``processes``: pg_loss pieces are already scaled to the whole mini-batch (sum; each process's sum is
    ``processes`` times its share, as DDP averages gradients), extremes combine as extremes, means weighted
    by tokens (exact for token means such as ppo_kl and pg_clipfrac)."""
    values = [v for v, _ in pairs]
    if key == "pg_loss":
        return sum(values) / processes
    if key.endswith("_max"):
        return max(values)
    if key.endswith("_min"):
        return min(values)
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else sum(values) / len(values)


class _EpochSeededRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler with a per-epoch seed, so a run resumed in a later epoch sees the same prompt order
    as an uninterrupted one (TRL's sampler advances one generator across epochs, which a resume resets)."""

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self.generator.manual_seed((self.seed or 0) + epoch)


class KPOTrainer(GRPOTrainer):
    """GRPOTrainer whose policy loss is ``kpo.policy_loss(args.loss, ...)``, with its settings in ``args``, a
    :class:`~kpo.train.trainer_config.KPOConfig` (GRPOConfig with kpo's fields; None = its defaults).

    Args (besides GRPOTrainer's):
        metrics_path: where to append one JSON row per optimizer step (None = do not write).
        interrupts: the guard that records SIGINT/SIGTERM (None = not stopped at a batch boundary).
        run_card: writes the run's README.md in place of TRL's model card (None = TRL's card).
    """

    def __init__(
        self,
        model,
        reward_funcs,
        args=None,
        *rest,
        metrics_path: str | Path | None = None,
        interrupts: InterruptGuard | None = None,
        run_card: Callable[[], object] | None = None,
        **kwargs,
    ):
        args = trainer_args(args, kwargs)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        if self._is_vlm:
            raise ValueError("KPOTrainer trains text-only models: its loss's forward passes no image inputs")
        if self.aux_loss_enabled:
            raise ValueError(
                "KPOTrainer's loss is kpo.policy_loss alone, without the MoE router's load-balancing loss TRL would "
                "add here: set router_aux_loss_coef=0.0 to train without it"
            )
        loss_name, rollout_dtype, rollout_lag = args.loss, args.rollout_dtype, args.rollout_lag
        self.loss_name = loss_name
        self.loss_kwargs = args.resolved_loss_kwargs()  # memory="matched" as its number of tokens
        self.loss_agg_mode = args.resolved_agg_mode()
        self.advantage = args.advantage
        self._wants_entropy = "token_entropy" in get_loss_spec(loss_name).hparams
        self.metrics_path = Path(metrics_path) if metrics_path is not None else None
        self.dump_ratios_every = args.dump_ratios_every
        self.ratios_dir = Path(args.output_dir) / "ratios"
        self._dump_parts: list[dict[str, torch.Tensor]] = []
        self._generation_stats: dict[str, float] = {}
        # loss metrics of the current optimizer step's micro-batches: (value, valid tokens)
        self._step_loss_metrics: dict[str, list[tuple[float, float]]] = defaultdict(list)
        # this optimizer step's entropy pieces, one per micro-batch, each already a share of the whole step
        self._step_entropy: list[float] = []
        # memory="auto": one q per optimizer step over every micro-batch and process, fitted at the end of a step
        # for the next (kpo.filter.fit.StepFit); before any step identifies q, the matched memory's
        self.memory_fit = (
            step_fit(
                loss_name,
                self.loss_kwargs,
                q_for_memory(matched_memory(self.max_completion_length)),
                steps_per_batch=self.steps_per_batch,  # each generation batch's first step is not fitted
            )
            if fits_memory(loss_name, self.loss_kwargs)
            else None
        )
        self._fit_metrics: dict[str, float] = {}  # what the last finished step's losses used
        self.interrupts = interrupts
        self.run_card = run_card
        self._batch_end_rng: dict | None = None  # RNG states where the last finished generation batch ended
        self._flat_batches = 0  # generation batches in a row with zero reward variance in every group
        self.sampler = RolloutSampler(rollout_dtype, rollout_lag)
        self.ratio_anchor = ratio_anchor = args.ratio_anchor
        self.rollout_correction = args.rollout_correction()
        uses_sampler = (
            rollout_dtype != "float32" or rollout_lag or ratio_anchor != "trainer" or self.rollout_correction
        )
        reason = fast_rollout_unsupported(self, None, None)
        if uses_sampler and reason is not None:
            # the sampler's model and log-probs are kpo's decoder's; TRL's paths give neither
            raise ValueError(
                f"rollout_dtype, rollout_lag, ratio_anchor=rollout and rollout_is/rollout_rs need kpo's sampler, which this "
                f"run cannot use ({reason}); leave them at their defaults"
                + (" (with vLLM, TRL's vllm_importance_sampling_* correct the mismatch)" if self.use_vllm else "")
            )

    def _get_train_sampler(self, dataset=None):
        dataset = self.train_dataset if dataset is None else dataset
        return _EpochSeededRepeatSampler(
            data_source=dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps per generation batch (``minibatches``)."""
        return self.args.steps_per_generation // self.args.gradient_accumulation_steps

    # ------------------------------------------------------------------ advantages
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        if fast_rollout_unsupported(self, images, multimodal_fields) is None:
            policy = self.accelerator.unwrap_model(self.model)
            return generate_single_turn(self, prompt_ids, self.sampler.model_for(policy, self.state.global_step))
        return super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )

    def _generate_and_score_completions(self, inputs):
        if not self.model.training or self.interrupts is None:
            output = super()._generate_and_score_completions(inputs)
        else:
            with self.interrupts.generation():
                output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            # TRL's rewards are gathered over processes in sampler order: each prompt's num_generations
            # responses are consecutive, so the group of response i is i // num_generations.
            weights = self.reward_weights.to(self._last_rewards_per_func.device)
            rewards = torch.nansum(self._last_rewards_per_func * weights.unsqueeze(0), dim=1)
            groups = torch.arange(rewards.shape[0]) // self.num_generations
            adv = compute_advantages(self.advantage, rewards, groups).to(output["advantages"].dtype)
            n_local = output["advantages"].shape[0]
            start = self.accelerator.process_index * n_local
            output["advantages"] = adv[start : start + n_local].to(output["advantages"].device)
            self._watch_reward_variance(rewards.view(-1, self.num_generations))
            if "sampling_per_token_logps" in output:
                self._measure_mismatch(output)
            metrics = self._metrics["train"]
            self._generation_stats = {k: metrics[k][-1] for k in _GENERATION_KEYS if metrics.get(k)}
        return output

    def _measure_mismatch(self, output: dict) -> None:
        """Log the generation batch's train-inference mismatch (``rollout_corr/*``, over every process's tokens)
        and set its PPO anchor: ``old_per_token_logps`` stays the trainer's (TRL computes it where a batch has
        off-policy steps; here also where it has none) or becomes the sampler's."""
        trainer_logps = output.get("old_per_token_logps")
        if trainer_logps is None:  # one optimizer step per batch: TRL skips the recomputation
            with torch.no_grad():
                ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
                attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
                trainer_logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    ids,
                    attention,
                    output["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size,
                )
        rollout_logps = output["sampling_per_token_logps"]
        sums = mismatch_sums(trainer_logps, rollout_logps, self._loss_mask(output))
        sums = self.accelerator.reduce(sums.to(self.accelerator.device), reduction="sum").cpu()
        for key, value in mismatch_metrics(sums).items():
            self._metrics["train"][key].append(value)
        output["old_per_token_logps"] = rollout_logps if self.ratio_anchor == "rollout" else trainer_logps

    def _watch_reward_variance(self, grouped: torch.Tensor) -> None:
        """Count generation batches in a row whose every group ([prompts, num_generations] rewards) scored all its
        responses alike, and say once, at FLAT_REWARD_BATCHES, why nothing is learned and what to try."""
        flat = bool((grouped == grouped[:, :1]).all())
        self._flat_batches = self._flat_batches + 1 if flat else 0
        if self._flat_batches != FLAT_REWARD_BATCHES or not self.accelerator.is_main_process:
            return
        values = sorted({float(v) for v in grouped.flatten().tolist()})
        scored = (
            f"every response scored {values[0]:g}"
            if len(values) == 1
            else "every group scored its responses alike"
        )
        steps_per_batch = self.steps_per_batch
        first = self.state.global_step - (FLAT_REWARD_BATCHES - 1) * steps_per_batch + 1
        print(
            f"kpo train: warning: zero reward variance in every group for {FLAT_REWARD_BATCHES} generation batches "
            f"in a row (steps {first}-{self.state.global_step + steps_per_batch}; {scored}): every advantage is 0, "
            f"so the policy does not learn. Likely all responses are equally wrong or right: the completion length "
            f"({self.max_completion_length} tokens) too short to reach an answer, the task too hard or too easy "
            f"for the model, or a reward function that does not match the output format. Try a larger "
            f"--max-completion-length, an easier or harder --dataset, or check a few generations against the "
            f"reward function",
            file=sys.stderr,
            flush=True,
        )

    # ------------------------------------------------------------------ interrupts and the run card
    def _maybe_log_save_evaluate(self, *args, **kwargs):
        super()._maybe_log_save_evaluate(*args, **kwargs)
        if self.interrupts is not None and self.state.global_step % self.steps_per_batch == 0:
            # where a save at this step took (or would have taken) the RNG states from
            self._batch_end_rng = rng_state()

    def _save_checkpoint(self, model, trial):
        def save():
            super(KPOTrainer, self)._save_checkpoint(model, trial)
            state = self.sampler.state_dict()  # a lagging sampler's weights: part of the trajectory
            folder = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
            if state and self.accelerator.is_main_process:
                save_file(state, str(folder / SAMPLER_FILE))
            if self.memory_fit is not None and self.accelerator.is_main_process:
                # the q the next step filters with: part of the trajectory too
                with writing(folder / MEMORY_FIT_FILE), open(folder / MEMORY_FIT_FILE, "w") as f:
                    json.dump(self.memory_fit.state_dict(), f)

        if self.interrupts is None:
            return save_whole(self, save)
        with self.interrupts.deferred():
            return save_whole(self, save)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = Path(resume_from_checkpoint) / SAMPLER_FILE
        if path.exists():
            self.sampler.load_state_dict(load_file(str(path)))
        fit = Path(resume_from_checkpoint) / MEMORY_FIT_FILE
        if self.memory_fit is not None and fit.exists():
            self.memory_fit.load_state_dict(json.loads(fit.read_text()))
        if self.memory_fit is not None:  # its generation batches count from the checkpoint's step (checkpoint-N)
            self.memory_fit.steps = int(Path(resume_from_checkpoint).name.rpartition("-")[2])

    def checkpoint_abandoned_batch(self) -> Path | None:
        """After :class:`~kpo.train.interrupt.AbandonBatch`: the checkpoint of the last finished generation batch,
        written with the RNG states rewound to that batch's end unless a regular save (or the checkpoint this run
        resumed from) already holds it; None when no batch has finished (nothing to keep)."""
        step = self.state.global_step
        if step == 0:
            return None
        folder = Path(self.args.output_dir) / f"checkpoint-{step}"
        saved = incomplete_reason(folder) is None
        # every process looks before the main one writes the folder: all of them save, or none
        self.accelerator.wait_for_everyone()
        if not saved:
            restore_rng(self._batch_end_rng)
            self._save_checkpoint(self.model_wrapped, trial=None)
        return folder

    def create_model_card(self, *args, **kwargs):
        """kpo's run card (``run_card``) where TRL would write its boilerplate one (at every checkpoint and on
        push_to_hub), so TRL never replaces it."""
        if self.run_card is None:
            return super().create_model_card(*args, **kwargs)
        if self.accelerator.is_main_process:
            self.run_card()

    # ------------------------------------------------------------------ global counts for accumulation
    def _prepare_inputs(self, generation_batch):
        before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self._buffered_inputs is not before:
            self._annotate_global_counts(self._buffered_inputs)
        return inputs

    def _annotate_global_counts(self, micro_batches: list[dict]) -> None:
        """Give each micro-batch the sequence and token counts of its whole optimizer-step mini-batch
        (all accumulation steps and all processes), which the loss divides by."""
        ga = self.args.gradient_accumulation_steps
        for first in range(0, len(micro_batches), ga):
            group = micro_batches[first : first + ga]
            local = torch.tensor(
                [
                    sum(int(mb["completion_ids"].shape[0]) for mb in group),
                    sum(int(self._loss_mask(mb).sum()) for mb in group),
                ],
                dtype=torch.float64,
                device=self.accelerator.device,
            )
            total = self.accelerator.reduce(local, reduction="sum").tolist()
            for mb in group:
                mb["kpo_global_num_seqs"], mb["kpo_global_num_tokens"] = total

    @staticmethod
    def _loss_mask(inputs: dict) -> torch.Tensor:
        mask = inputs["completion_mask"]
        return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]

    # ------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = self._loss_mask(inputs)
        log_prob, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        old = inputs.get("old_per_token_logps")
        # TRL skips old log-probs only when each generation batch is one optimizer step (fully on-policy).
        old_log_prob = log_prob.detach() if old is None else old
        # memory="auto": the loss at this step's q, fixed (the same on every process and micro-batch)
        fit = self.memory_fit
        hparams = dict(self.loss_kwargs) if fit is None else fixed_q_kwargs(self.loss_kwargs, fit.q)
        if self._wants_entropy:
            hparams["token_entropy"] = entropy.detach()
        if "importance_sampling_ratio" in inputs:  # vLLM train/inference mismatch weights (TRL's IS mode)
            hparams["rollout_is_weights"] = inputs["importance_sampling_ratio"].expand_as(log_prob)
        rollout_kw = {}
        if self.rollout_correction and self.ratio_anchor == "trainer":
            # verl's decoupled mode: weights from pi_trainer / pi_sampler (old_log_prob is the trainer's)
            rollout_kw = {"rollout_log_prob": inputs["sampling_per_token_logps"], **self.rollout_correction}
        elif self.rollout_correction:
            # verl's bypass mode: the ratio pi_theta / pi_sampler is the correction (no TIS weight), and rejection,
            # decided on it, takes the token out of the mask as verl's modified response mask does
            weights, _ = rollout_correction(log_prob.detach(), old_log_prob, mask, **self.rollout_correction)
            mask = mask * (weights > 0)
        training = self.model.training
        global_batch = {}
        if training:
            global_batch = {
                "global_num_seqs": inputs["kpo_global_num_seqs"],
                "global_num_tokens": inputs["kpo_global_num_tokens"],
                "dp_size": self.accelerator.num_processes,
                # Dr. GRPO's constant (seq-mean-token-sum-norm; the other modes ignore it): the longest allowed
                # response, not this batch's padded width, which varies per batch and with GPU padding
                "loss_scale_factor": self.max_completion_length,
            }
        loss, metrics = policy_loss(
            self.loss_name,
            log_prob=log_prob,
            old_log_prob=old_log_prob,
            advantages=inputs["advantages"],
            response_mask=mask,
            loss_agg_mode=self.loss_agg_mode,
            **rollout_kw,
            **hparams,
            **global_batch,
        )
        with torch.no_grad():
            # aggregated as the loss is (same mode and global counts): the pieces of an optimizer step then sum
            # to the entropy of its whole mini-batch, whatever the micro-batch size
            ent = aggregate_entropy(
                entropy,
                mask,
                self.loss_agg_mode if self.loss_agg_mode != "seq-mean" else "seq-mean-token-mean",
                **global_batch,
            )
        ent = self.accelerator.gather(ent.detach()).mean().item()  # mean over ranks: dp_size cancels
        if not training:
            self._metrics["eval"]["entropy"].append(ent)
            return loss
        self._step_entropy.append(ent)
        n_tokens = float(mask.sum())
        for key, value in metrics.items():
            self._step_loss_metrics[key].append((value, n_tokens))
        if self.dump_ratios_every:
            self._maybe_dump(log_prob, old_log_prob, mask)
        if self.memory_fit is not None:
            add_to_fit(self.memory_fit, log_prob, old_log_prob, mask)
            if (self._step + 1) % self.current_gradient_accumulation_steps == 0:  # the step's last micro-batch
                self._fit_metrics = self.memory_fit.metrics()
                self.memory_fit.finish()  # every process: the q of the next step
        return loss

    # ------------------------------------------------------------------ ratio dumps
    def _maybe_dump(self, log_prob, old_log_prob, mask) -> None:
        step = self.state.global_step + 1  # the optimizer step this micro-batch belongs to
        if step % self.dump_ratios_every:
            return
        self._dump_parts.append(
            {
                "log_ratio": (log_prob - old_log_prob).detach().float().cpu(),
                "mask": mask.detach().to(torch.uint8).cpu(),
            }
        )
        if (self._step + 1) % self.current_gradient_accumulation_steps:
            return  # more micro-batches of this optimizer step to come
        parts, self._dump_parts = self._dump_parts, []
        width = max(p["mask"].shape[1] for p in parts)
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        log_ratio = torch.cat([pad(p["log_ratio"]) for p in parts])
        mask_u8 = torch.cat([pad(p["mask"]) for p in parts])
        if self.accelerator.num_processes > 1:
            # every process's rows (rank 0's, then rank 1's, ...), padded to the widest
            log_ratio, mask_u8 = (
                self.accelerator.gather(
                    self.accelerator.pad_across_processes(t.to(self.accelerator.device), dim=1)
                ).cpu()
                for t in (log_ratio, mask_u8)
            )
        if not self.accelerator.is_main_process:
            return
        # the first optimizer step of a generation batch updates the policy that sampled it: on-policy, whatever
        # rounding makes of its log-ratios (kpo analyze --off-policy-only reads this)
        write_dump(
            self.ratios_dir / f"step_{step:06d}.safetensors",
            log_ratio,
            mask_u8,
            step=step,
            # memory=auto: the q this step's losses used
            settings=filter_settings(
                self.loss_name, self.loss_kwargs, fitted_q=None if self.memory_fit is None else self.memory_fit.q
            ),
            loss=self.loss_name,
            on_policy=on_policy_step(step, self.steps_per_batch),
        )

    # ------------------------------------------------------------------ logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        training = self.model.training and "train_runtime" not in logs
        if training:
            metrics = self._metrics["train"]
            loss_metrics = self._gathered_loss_metrics()
            if on_policy_step(self.state.global_step, self.steps_per_batch) and "pg_clipfrac" in loss_metrics:
                # a statistic of the generation batch, carried like the others to the batch's later steps
                self._generation_stats["rollout_corr/on_policy_clip_frac"] = loss_metrics["pg_clipfrac"]
            for key, value in self._generation_stats.items():
                if not metrics.get(key):
                    metrics[key].append(value)
            loss_metrics |= self._fit_metrics  # memory="auto": the q the step used, the same on every process
            for key, value in loss_metrics.items():
                metrics[f"loss/{key}"].append(value)
            self._step_loss_metrics.clear()
            if self._step_entropy:
                metrics["entropy"].append(sum(self._step_entropy))
                self._step_entropy.clear()
        super().log(logs, start_time)
        if training and self.metrics_path is not None and self.accelerator.is_main_process:
            self._write_row(logs)

    def _gathered_loss_metrics(self) -> dict[str, float]:
        """This optimizer step's loss metrics over its micro-batches and every process (:func:`_combine`); every
        process calls it, with the same keys and number of micro-batches."""
        keys = list(self._step_loss_metrics)
        processes = self.accelerator.num_processes
        if processes == 1 or not keys:
            return {k: _combine(k, self._step_loss_metrics[k]) for k in keys}
        # [K keys, M micro-batches, (value, tokens)] -> [processes, K, M, 2]
        local = torch.tensor([self._step_loss_metrics[k] for k in keys], dtype=torch.float64)
        every = self.accelerator.gather(local.unsqueeze(0).to(self.accelerator.device)).cpu()
        return {k: _combine(k, every[:, i].reshape(-1, 2).tolist(), processes) for i, k in enumerate(keys)}

    def _write_row(self, logs: dict[str, float]) -> None:
        def get(key, default=float("nan")):
            value = logs.get(key)
            return default if value is None else float(value)

        row = {
            "step": int(self.state.global_step),
            "reward_mean": get("reward"),
            "reward_std": get("reward_std"),
            "entropy": get("entropy"),
            "clip_frac": get("loss/pg_clipfrac"),
            "pg_loss": get("loss/pg_loss"),
            "ppo_kl": get("loss/ppo_kl"),
            "response_length": get("completions/mean_length"),
            "step_time": get("step_time"),
            "learning_rate": get("learning_rate"),
            "grad_norm": get("grad_norm"),
            "frac_reward_zero_std": get("frac_reward_zero_std"),
            "world_size": self.accelerator.num_processes,  # processes the step was trained on
        }
        row |= {
            k.removeprefix("loss/"): float(v)
            for k, v in logs.items()
            if k.startswith("loss/") and k.removeprefix("loss/") not in row
        }
        row |= {k: float(v) for k, v in logs.items() if k in _SAMPLING_KEYS or k in _MISMATCH_KEYS}
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with writing(self.metrics_path), open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")  # one line per write: a cut leaves at most the last one torn
