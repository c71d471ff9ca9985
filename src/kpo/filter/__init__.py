"""Causal Kalman filter over token log importance ratios (docs/methods.md section K).

The gains depend only on q, v, p0 and the number of steps taken, so the filter is a first-order linear
scan x_t = (1 - K_t) x_{t-1} + K_t z_t with gains from a cached float64 table (``gains.py``). Three
interchangeable paths compute it, each checked against the float64 loop in ``reference.py``:

- ``numba``  compiled CPU loop (extra ``fast``, ``compiled.py``), four rows in step over tiles of 64 tokens,
  float64 state;
- ``triton`` GPU kernel for CUDA tensors (extra ``gpu``, ``triton.py``);
- ``torch``  chunked scan on any device (``scan.py``; chunks in the input's float32/float64, float64 carries
  between chunks): the fallback when the others are missing.

``kalman_filter(..., backend=...)`` picks one (``dispatch.py``). The authors' closed form, for comparison only,
is ``authors.authors_closed_form``. ``fit_q`` (``fit.py``) fits the filter's q to a batch by maximum likelihood
(KPO's ``memory="auto"``).
"""

from kpo.filter.dispatch import BACKENDS, kalman_filter
from kpo.filter.fit import fit_q
from kpo.filter.gains import kalman_gains
from kpo.filter.reference import MASK_MODES

__all__ = ["BACKENDS", "MASK_MODES", "fit_q", "kalman_filter", "kalman_gains"]
