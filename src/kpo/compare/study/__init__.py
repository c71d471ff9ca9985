"""``kpo compare study``: a confirmatory study of the user's own questions, on any engine ``kpo compare`` runs.

A plan (:mod:`~kpo.compare.study.plan`) fixes the questions in order, the arms, the cells, each group's looks and
error spending (or looks at any time), the collapse rule and the seeds; ``--register`` checks it whole, sizes it
by simulation (:mod:`~kpo.compare.study.simulate`: whole seeds resampled from a pilot, or stated effects) and
writes ``plan.json``, committed before the first run and never changed after it
(:mod:`~kpo.compare.study.registration`). The study then trains look by look (:mod:`~kpo.compare.study.run`),
recording each run (:mod:`~kpo.compare.study.records`, checked whenever read), tests each question with the seed
as the unit and decides by the gate and Holm (:mod:`~kpo.compare.study.looks`), and writes its report and figures
at every step (:mod:`~kpo.compare.study.report`, :mod:`~kpo.compare.study.plots`). The embedded study,
``docs/results/study``, is such a plan (version 1, read as it was registered).
"""
