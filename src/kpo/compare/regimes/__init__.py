"""``kpo compare regimes``: where does KPO help? A grid of regimes (cells), the same arms paired by seed in each,
and a few questions pooled over cells, each answered as a lead by a study's seed-level test.

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

Every cell runs vanilla (GRPO), GSPO, KPO at the length-matched memory and KPO with its memory fitted to each
optimizer step (``memory=auto``); the stress cells also run the token ratio clipped at KPO's band without the
filter (filter or band?). The arms of a seed share its warm start, prompt stream and evaluation problems; each
cell is a full ``kpo compare`` report of its own in ``OUT/CELL/``, and every cell's seeds share one warm start per
seed (``OUT/warm_start-seedN`` holds its evaluation).

A run **collapsed** when its final held-out accuracy is below its seed's warm start's. The map is exploratory:
its questions (:data:`QUESTIONS`) are tested once, at the map's seeds, by the test a study uses
(:func:`kpo.compare.study.looks.test_look`: each seed's cells pooled into one difference, the exact sign-flip
test), unadjusted: leads for a study whose plan is registered before its runs (``kpo compare study``, which can
size itself from this map's report.json). The questions and the rules are printed and written to ``plan.json``
before anything trains; the map (``report.md``, ``report.json`` with ``cells`` and ``questions``,
``regimes.png``, ``memory.png``) is rewritten as each cell finishes, and a rerun resumes (finished runs are
reused). plan.json is written once, before the first run: a later command with other flags stops, and
``--report`` only reads it.

Modules: ``design`` (the map's settings, cells, arms, questions and rules, and what a cell of it says), ``plan``
(its cost and plan.json, written once), ``run`` (training its runs), ``report`` (report.md, report.json and the
figures).
"""

from kpo.compare.regimes.design import QUESTIONS, REGIME_RULES, RegimeConfig, answers, cell_entry, groups
from kpo.compare.regimes.run import run_regimes

__all__ = ["QUESTIONS", "REGIME_RULES", "RegimeConfig", "answers", "cell_entry", "groups", "run_regimes"]
