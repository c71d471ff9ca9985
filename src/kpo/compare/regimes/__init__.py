"""``kpo compare regimes``: where does KPO help? A grid of regimes (cells: the sampler's train-inference mismatch,
the off-policy depth, the learning rate), the same arms paired by seed in each, and a few questions pooled over
cells (:data:`~kpo.compare.regimes.design.QUESTIONS`): a study's plan made from the grid's flags
(:func:`~kpo.compare.regimes.design.map_plan`), written to ``OUT/plan.json`` once and run by the study's machinery
(:mod:`kpo.compare.study`), the runs under ``OUT/CELL/runs`` with one warm start per seed shared by every cell.
What each cell means, the questions and how the map is read: docs/compare.md, "The regime map".
"""

from kpo.compare.regimes.design import GRID, QUESTIONS, RegimeConfig, groups, map_plan, run_regimes

__all__ = ["GRID", "QUESTIONS", "RegimeConfig", "groups", "map_plan", "run_regimes"]
