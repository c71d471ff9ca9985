"""``kpo compare``: train, evaluate and analyze several methods and seeds into one report.

Every (method, seed) run trains on the embedded task (by default the long-response running-sum task: 128-token
responses) under the paper's off-policy protocol with the method's paper hyperparameters (nothing tuned per
method: every run shares one set of protocol flags, and the seed fixes the warm start and the data order), then
its final model is evaluated on the held-out split (avg@n, pass@k) and its dumped ratios are analyzed. KPO runs
twice per seed: at the paper's Q/V (a memory of 1000 tokens) and at the memory that keeps the paper's
memory-to-length ratio at this task's response length (``memory=matched``); a memory sweep adds the Figure 4
analog. Each seed's warm start is evaluated on the same problems, as the Table 1 baseline every method starts
from. The report (``report.md`` + PNGs) holds the analogs of the paper's Figure 3, Table 1, Figure 4 and
Table 2, and a "claims" section that says, with numbers and intervals, whether each claim holds.

Runs execute in parallel worker processes (one torch thread each); a run with ``config.yaml``, ``metrics.jsonl``
and ``eval.json`` is done and is not rerun, so an interrupted compare resumes where it stopped. A done run made
with other settings (its ``config.yaml`` or ``eval.json`` differs from what this compare would use) is an error,
never silently reused.

Modules: ``plan`` (settings, arms and runs), ``run`` (workers, reuse of finished runs), ``report`` (tables,
figures and the claims), ``cli`` (the command).
"""

from kpo.compare.plan import WARM_START, CompareConfig, CompareError, Run, arms, plan_runs, sweep_runs
from kpo.compare.run import run_compare

__all__ = [
    "WARM_START",
    "CompareConfig",
    "CompareError",
    "Run",
    "arms",
    "plan_runs",
    "run_compare",
    "sweep_runs",
]
