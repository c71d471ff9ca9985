"""``kpo compare``: train, evaluate and analyze several arms and seeds into one report whose differences are paired
by seed.

Every run trains on the embedded task (by default the long-response running-sum task: 128-token responses) under
the paper's off-policy protocol with its method's paper hyperparameters (nothing tuned per method: every run
shares one set of protocol flags). The default design asks "does KPO help, and when?": KPO at the memory that
keeps the paper's memory-to-length ratio (``memory=matched``) against vanilla (GRPO) and GSPO at 12 seeds; the
ablations that isolate the filter (KPO's clip band without the filter, a constant-gain moving average, KPO at
the paper's Q/V); and an A/A arm (KPO (matched) again from the same warm starts with other RL seeds), the
measured noise floor. The arms of a seed share its warm start, prompt stream and evaluation samples, so every
difference is taken within a seed (:func:`kpo.evaluation.metrics.paired_diff_ci`). Before anything trains it
prints the plan: the runs, the estimated time and the expected half-width of each contrast. Each model is scored
by its exact expected held-out accuracy (:mod:`kpo.evaluation.expected`) and by sampled avg@n / pass@k; the
report (``report.md`` + PNGs) holds the paired contrasts, the analogs of the paper's Figure 3, Table 1, Figure 4
and Table 2, and a "claims" section that says, by rules fixed before the runs, whether each claim holds.

Runs execute in parallel worker processes (one torch thread each); a run with ``config.yaml``, ``metrics.jsonl``
and its evaluations is done and is not rerun, so an interrupted compare resumes where it stopped. A done run made
with other settings (its ``config.yaml`` or ``eval.json`` differs from what this compare would use) is an error,
never silently reused.

``kpo compare study`` (:mod:`kpo.compare.study`) runs a plan of the user's own to its answer; ``kpo compare
regimes`` (:mod:`kpo.compare.regimes`) makes such a plan from a grid of regimes of train-inference mismatch,
off-policy depth and learning rate, and runs it: a map of where KPO may help.

``--model``/``--dataset``/``--eval-data`` run it on a user's model, training data and held-out benchmarks (scored
by avg@n), and ``--engine verl`` trains every run with verl's ``main_ppo`` on the user's verl configuration.

Modules: ``plan`` (settings, arms, runs, contrasts and the cost and power estimate), ``checks`` (the settings'
checks every engine shares), ``run`` (workers, reuse of finished runs), ``engines`` (what trains a run: the
engine protocol and registry; ``engines.kpo``: kpo train, ``engines.verl``: verl), ``outcome`` (a model's
held-out score, the one number the decisions read), ``report`` (tables, figures and the claims), ``cell`` (a
regime: mismatch, depth, learning rate), ``regimes`` (the map: a study's plan from a grid), ``study`` (a study:
plan, records, looks, simulation, registration, run, report), ``cli`` (the command).
"""

from kpo.compare.plan import (
    WARM_START,
    Arm,
    CompareConfig,
    CompareError,
    Run,
    arms,
    contrasts,
    estimate,
    plan_runs,
    sweep_runs,
)
from kpo.compare.run import run_compare

__all__ = [
    "WARM_START",
    "Arm",
    "CompareConfig",
    "CompareError",
    "Run",
    "arms",
    "contrasts",
    "estimate",
    "plan_runs",
    "run_compare",
    "sweep_runs",
]
