"""``kpo compare regimes``: where does KPO help? A grid of regimes (cells), the same arms paired by seed in each,
and a few questions pooled over cells: a study's plan made from the grid's flags, run by the study's machinery.

The paper's argument is about token ratios made noisy by train-inference mismatch, staleness and high learning
rates, where GRPO collapses. A cell fixes one point of that space:

- mismatch: ``none`` (the sampler is the trainer's float32 policy, the ratio's anchor the trainer's recomputed
  log-probs: every batch's first step has ratio 1), ``bf16`` or ``fp8`` (the sampler a bf16 or FP8 copy of the
  policy and the anchor the sampler's log-probs, verl's bypass mode: the mismatch reaches every ratio;
  :mod:`kpo.train.sampler`);
- depth: optimizer steps per generation batch (``--minibatches``), every cell drawing the same number of
  generation batches (``batches``), so the same number of samples: depth 16 takes 4 times the steps of depth 4 on
  mini-batches a quarter the size, 15 of every 16 of them off-policy;
- learning rate: the map's lowest is its **stable** rate, its highest its **stress** rate.

The map's questions (:data:`~kpo.compare.regimes.design.QUESTIONS`) compare GRPO, GSPO, KPO at the length-matched
memory, KPO with its memory fitted to each optimizer step (``memory=auto``) and, at the stress rate, the token ratio
clipped at KPO's band without the filter (filter or band?); a cell trains the arms its group's questions read. A
run **collapsed** when its final held-out accuracy is below its seed's warm start's. The map is a study
(:mod:`kpo.compare.study`) whose plan the flags make (:func:`~kpo.compare.regimes.design.map_plan`): one look at
the map's seeds, each seed's cells pooled into one difference and tested by the exact sign-flip test, Holm over the
questions. It is written to ``OUT/plan.json`` before anything trains, and a later command with other flags stops;
the study's records (``runs.json``), report and figures are in ``OUT``, the runs under ``OUT/CELL/runs``, one warm
start per seed shared by every cell. The report calls the map exploratory unless its plan.json was committed
before its first run: a map is for leads, a registered study (``kpo compare study``) for decisions.
"""

from kpo.compare.regimes.design import GRID, QUESTIONS, RegimeConfig, groups, map_plan, run_regimes

__all__ = ["GRID", "QUESTIONS", "RegimeConfig", "groups", "map_plan", "run_regimes"]
