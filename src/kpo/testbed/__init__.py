"""The embedded testbed: a run that needs no download, in one place.

- :mod:`kpo.testbed.task`: the synthetic arithmetic tasks (running sum, chain), their splits and grader;
- :mod:`kpo.testbed.files`: the task as files (verl's RL parquet schema) and the reward function verl calls;
- :mod:`kpo.testbed.tiny`: the tiny character-level model (its supervised warm start trains in
  :mod:`kpo.train.warm_start`);
- :mod:`kpo.testbed.cli`: ``kpo task``, which writes the task and its warm start as files.

Import the submodule you need; this package imports nothing eagerly.
"""
