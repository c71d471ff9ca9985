"""Adapters of kpo's losses to host trainers.

``kpo.integrations.verl`` is verl's plugin (it imports verl, so it is never imported from here: ``import kpo``
and ``import kpo.integrations`` must work without verl installed).
"""
