"""Datasets: math benchmark and training-file loaders (:mod:`kpo.data.math`); the embedded synthetic task is in
:mod:`kpo.testbed`. Import the submodule you need; this package imports nothing eagerly."""
