"""verl custom reward function: kpo's binary math reward (``kpo.rewards.math_reward``, math-verify).

Selected with ``reward.custom_reward_function.path=examples/verl/reward.py`` and
``reward.custom_reward_function.name=compute_score``. verl calls it once per response with the row's
``data_source``, the decoded response, ``reward_model.ground_truth`` and ``extra_info``; rows written by
``prepare_data.py`` carry every accepted answer in ``extra_info["answers"]``.
"""

from __future__ import annotations

from typing import Any

from kpo.rewards import math_reward


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **_: Any
) -> float:
    """1.0 if the response's final answer matches one accepted answer, else 0.0 (never raises).

    ``**_`` takes the extra keywords verl's reward loop may add (e.g. ``reward_kwargs`` from the config).
    """
    answers = (extra_info or {}).get("answers")
    # verl hands parquet lists over as numpy arrays: test the length, not the truth value.
    return math_reward(
        solution_str, [str(a) for a in answers] if answers is not None and len(answers) else ground_truth
    )
