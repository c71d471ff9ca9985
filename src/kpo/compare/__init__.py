"""``kpo compare``: train, evaluate and analyze several arms and seeds into one report whose differences are paired
by seed (the arms of a seed share its warm start, prompt stream and evaluation samples). Before anything trains
it prints the plan (runs, time, expected half-widths); a finished run is reused, one made with other settings is
an error, so an interrupted compare resumes where it stopped. The default design, the claim rules, the report and
the user's own setup (``--model``, ``--dataset``, ``--eval-data``, ``--engine verl``): docs/compare.md.

``kpo compare study`` (:mod:`kpo.compare.study`) runs a plan of the user's own to its answer; ``kpo compare
regimes`` (:mod:`kpo.compare.regimes`) makes such a plan from a grid of regimes of train-inference mismatch,
off-policy depth and learning rate, and runs it: a map of where KPO may help.

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

__all__ = ["WARM_START", "Arm", "CompareConfig", "CompareError", "Run", "arms", "contrasts", "estimate", "plan_runs",
           "run_compare", "sweep_runs"]
