"""Datasets: the embedded synthetic arithmetic task (:mod:`kpo.data.synthetic`) and math benchmark loaders
(:mod:`kpo.data.math`). Import the submodule you need; this package imports nothing eagerly."""
