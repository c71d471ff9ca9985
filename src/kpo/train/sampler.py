"""The rollout sampler of ``kpo train``: the policy as an inference engine would run it, and the mismatch that
makes between the sampler's log-probs and the trainer's.

A real RL system samples with one computation of the policy (vLLM or SGLang in bfloat16, often with quantized
weights) and trains another (FSDP in float32 or bf16 autocast). The two assign a token different log-probs, and
whose log-probs anchor the PPO ratio decides whether that mismatch reaches the ratio (verl's decoupled mode: the
trainer's recomputed ones; its bypass mode, or an async trainer: the sampler's). :class:`RolloutSampler` gives
``kpo train`` such a sampler on a CPU: a copy of the policy in ``rollout_dtype``, refreshed from the trainer's
weights before every generation batch (as a colocated engine's weight sync does after every optimizer step of
the previous batch), whose tokens and per-token log-probs are the batch's rollout.

- ``float32``: the policy itself (no copy); the sampler's log-probs differ from the trainer's only by the
  rounding of kpo's decoder against the transformers forward, the floor of the measured mismatch.
- ``bfloat16``: every weight rounded to bf16 and the decoder run in bf16 (matmuls accumulate in float32, their
  outputs and the cache are bf16), as a bf16 inference engine beside a float32 trainer.
- ``float8``: bf16, and FP8 as vLLM runs it with ``quantization="fp8"`` and ``kv_cache_dtype="fp8"`` on a GPU
  with FP8 matmuls (W8A8; the FP8 rollouts of FlashRL and verl): the weights of every projection of the decoder
  blocks rounded to float8 e4m3 with one scale per output channel, the activations into those projections rounded
  to e4m3 with one scale per token, every key and value with one scale per token and head
  (``Qwen3Decoder(fp8=True)``); embeddings, norms
  and the LM head stay bf16, as those engines leave them.

Why ``float8`` exists: the embedded model has 2 layers and is far more confident than a language model (0.07
nats per token), so its bf16 mismatch sits at the low end of, or below, the 0.02-0.04 nats RMS per-token log-prob
gap reported for bf16 samplers of 0.5B-7B models (28-36 layers, whose rounding accumulates with depth). Measured
on its warm start, 128 held-out prompts (16k tokens sampled by kpo's decoder, scored by the float32 trainer): bf16
0.016 RMS (24% of tokens outside KPO's 3e-4/4e-4 band, k3 1.0e-4), float8 0.038 (50%, k3 5.6e-4), float32 4e-7
(k3 1e-13, the rounding floor). Scoring the trainer's own samples with a bf16 forward instead gives 0.006-0.008
for bf16: the sampler's own draws, made where it and the trainer disagree, widen the gap.

:func:`mismatch_metrics` measures the mismatch of a generation batch with verl's definitions and names.
"""

from __future__ import annotations

import copy

import torch

from kpo.generation.qwen3 import round_fp8

__all__ = [
    "MISMATCH_METRICS",
    "RATIO_ANCHORS",
    "ROLLOUT_DTYPES",
    "RolloutSampler",
    "mismatch_metrics",
    "mismatch_sums",
]

ROLLOUT_DTYPES = ("float32", "bfloat16", "float8")
RATIO_ANCHORS = ("trainer", "rollout")  # whose log-probs are the PPO anchor old_log_prob
# verl's rollout_corr/ metrics that kpo train logs for every generation batch (rollout_corr_helper.py)
MISMATCH_METRICS = ("kl", "k3_kl", "log_ppl_diff", "chi2_token")
_SAFETY_BOUND = 20.0  # verl clamps log-ratios at +-20 before exponentiating them


class RolloutSampler:
    """The model rollouts are sampled from.

    ``model_for(policy, version)`` is called before each generation batch with the trainer's optimizer step count;
    it returns the policy itself (``float32`` without lag), else a copy in ``dtype`` (``float8``: the blocks'
    projection weights on the FP8 grid) holding the policy's weights of ``lag`` generation batches ago (the
    oldest it has while fewer batches have passed), as an async trainer's engine samples with weights a few
    updates old. The weights of the last ``lag + 1`` batches are kept in float32 (``history``), and a checkpoint
    holds them (:meth:`state_dict`), so a resumed run samples from the weights the uninterrupted one would.
    """

    def __init__(self, dtype: str, lag: int = 0):
        if dtype not in ROLLOUT_DTYPES:
            raise ValueError(f"rollout dtype {dtype!r}: use one of {', '.join(ROLLOUT_DTYPES)}")
        if lag < 0:
            raise ValueError(f"rollout lag {lag}: give the generation batches the sampler lags by, >= 0")
        self.dtype, self.lag = dtype, lag
        self._copy: torch.nn.Module | None = None
        self.history: list[
            tuple[int, dict[str, torch.Tensor]]
        ] = []  # (version, float32 weights), oldest first
        self._loaded: int | None = None  # the version whose weights the copy holds

    @property
    def fp8(self) -> bool:
        """Whether the decoder runs the sampler's model as an FP8 engine (activations, keys and values)."""
        return self.dtype == "float8"

    def model_for(self, policy: torch.nn.Module, version: int) -> torch.nn.Module:
        """The sampler's model for the generation batch that starts at ``policy``'s weight ``version``."""
        if self.dtype == "float32" and not self.lag:
            return policy
        if self._copy is None:
            dtype = torch.float32 if self.dtype == "float32" else torch.bfloat16
            self._copy = copy.deepcopy(policy).to(dtype).eval().requires_grad_(False)
        if not self.history or self.history[-1][0] != version:
            weights = {name: p.detach().float().clone() for name, p in policy.named_parameters()}
            self.history = [*self.history, (version, weights)][-(self.lag + 1) :]
        oldest, weights = self.history[0]
        if self._loaded != oldest:
            self._refresh(weights)
            self._loaded = oldest
        return self._copy

    @torch.no_grad()
    def _refresh(self, weights: dict[str, torch.Tensor]) -> None:
        for name, mine in self._copy.named_parameters():
            mine.copy_(weights[name])  # rounds to bf16 (round to nearest even) where the copy is bf16
            if self.fp8 and mine.dim() == 2 and ".layers." in f".{name}" and "proj" in name:
                mine.copy_(round_fp8(mine))  # one scale per output channel: a row of [out, in]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The kept weights, ``"{version}/{name}"`` -> tensor (empty without lag: nothing to restore)."""
        if not self.lag:
            return {}
        return {f"{version}/{name}": w for version, weights in self.history for name, w in weights.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        history: dict[int, dict[str, torch.Tensor]] = {}
        for key, w in state.items():
            version, name = key.split("/", 1)
            history.setdefault(int(version), {})[name] = w
        self.history = sorted(history.items())
        self._loaded = None


def mismatch_sums(
    trainer_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The sums :func:`mismatch_metrics` divides, over a batch's valid tokens (``mask`` [B, T]) of the trainer's and
    the sampler's log-probs [B, T]: float64 [6] = (tokens, rows, sum of log pi_rollout - log pi_trainer, sum of
    k3, sum of rho^2, sum over rows of the difference of their mean log-probs, 0 for a row without a valid token
    as in verl's batch mean). Sums add over processes and micro-batches, so the metrics of a whole batch come
    from the sums of its parts."""
    m = mask.bool()
    lr = torch.where(
        m, trainer_log_prob.double() - rollout_log_prob.double(), 0.0
    )  # log rho, rho = pi_t / pi_r
    k3 = torch.where(m, torch.expm1(lr) - lr, 0.0)
    rho2 = torch.where(m, torch.exp(2.0 * lr.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)), 0.0)
    lengths = m.sum(dim=-1)
    rows = lengths > 0
    # verl's log_ppl_diff: per row, mean log pi_rollout - mean log pi_trainer = -(mean log rho)
    row_diff = -lr.sum(dim=-1)[rows] / lengths[rows]
    return torch.stack(
        [
            m.sum().double(),
            torch.tensor(float(m.shape[0]), dtype=torch.float64, device=m.device),
            -lr.sum(),
            k3.sum(),
            rho2.sum(),
            row_diff.sum(),
        ]
    )


def mismatch_metrics(sums: torch.Tensor) -> dict[str, float]:
    """verl's ``rollout_corr/`` mismatch metrics from :func:`mismatch_sums` (``compute_offpolicy_metrics``, with
    rho = pi_trainer / pi_rollout over valid tokens): ``kl`` = mean(log pi_rollout - log pi_trainer), ``k3_kl`` =
    mean(rho - 1 - log rho), ``chi2_token`` = mean(rho^2) - 1, ``log_ppl_diff`` = the mean over every row of (mean
    log pi_rollout - mean log pi_trainer), a row without a valid token counting 0 (verl divides by the batch).
    Empty when there is no valid token."""
    tokens, rows, kl, k3, rho2, row_diff = sums.tolist()
    if tokens == 0:
        return {}
    return {
        "rollout_corr/kl": kl / tokens,
        "rollout_corr/k3_kl": k3 / tokens,
        "rollout_corr/log_ppl_diff": row_diff / rows,
        "rollout_corr/chi2_token": rho2 / tokens - 1.0,
    }
