"""The defaults of ``kpo compare``: the methods, the ablations that isolate the filter, the seeds, steps and
samples a comparison runs when its options are not given (``--quick``'s too). Read by the plan and its checks."""

from __future__ import annotations

DEFAULT_METHODS = ("vanilla", "gspo")  # the baselines, at their paper hyperparameters, every seed
PAPER, MATCHED = "paper", "matched"  # KPO at the paper's Q/V; at the length-matched memory
MATCHED_KWARGS = (("memory", MATCHED),)
# The ablations that isolate the filter, each against KPO at the matched memory: (a) the token ratio clipped at
# KPO's band with no filter (memory -> 0); (b) a constant-gain moving average at the matched memory (the filter
# started at its steady state: no ramp from the prior); (c) KPO at the paper's Q/V (memory 1000 tokens); (d) KPO
# with its memory fitted to each mini-batch by maximum likelihood (memory=auto; not among the defaults).
ABLATIONS = {
    "clip_band": ("vanilla", (("clip_ratio_low", 3e-4), ("clip_ratio_high", 4e-4))),
    "constant_gain": ("kpo", (("memory", MATCHED), ("p0", "steady"))),
    "paper_qv": ("kpo", ()),
    "auto_memory": ("kpo", (("memory", "auto"),)),
}
DEFAULT_ABLATIONS = ("clip_band", "constant_gain", "paper_qv")
# Figure 4's points as filter memories in tokens (kpo.filter.memory); paper = Q/V 1e-6 = 1000 tokens. The
# default compare runs no sweep (--sweep-memory 8,matched,125,paper adds one).
SWEEP_MEMORY = ()
# optimizer steps per run: the long-testbed runs gained about 80% of their reward by step 100, and a 40-step pilot
# from the new warm start rose from 0.21 to 0.45 training reward; 80 leaves the budget 12 paired seeds
STEPS = 80
EVAL_N = 4  # samples per held-out problem (the claims read the exact expected accuracy, which needs none)
SEEDS = 12  # paired seeds of the key arms: KPO (matched) against vanilla and against GSPO
ABLATION_SEEDS = 4  # seeds of each ablation (the plan shows their wider intervals)
AA_SEEDS = 6  # seeds of the A/A arm (KPO at the matched memory again, another RL seed); 0 = none
REPLICA_SEED = 1000  # an A/A replica's RL seed is its seed + REPLICA_SEED x replica (its warm start: the seed's)
# what --quick sets where the option is not given: a smoke test in minutes
QUICK = {"steps": 40, "eval_n": 4, "seeds": 2, "ablation_seeds": 1, "aa_seeds": 1}
