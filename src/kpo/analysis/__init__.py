"""``kpo analyze``: the paper's token-dynamics analysis (Table 2, Figure 1, Figure 4) of importance-ratio dumps.

Input: ratio dumps written by ``kpo train --dump-ratios-every N`` (``<run>/ratios/step_{N:06d}.safetensors``
holding ``log_ratio`` [B, T] float32, ``filtered_log_ratio`` [B, T] float32, ``mask`` [B, T] uint8 and string
metadata step/loss/q/v), or any ``.safetensors``/``.npz`` file with ``log_ratio`` and ``mask``. PATH may be a
file, a run directory (its ``ratios/`` folder is used) or a folder of dumps; rows of all dumps are pooled.

Output in ``--out``: ``report.md`` (everything below, with links), ``table2.md``/``table2.json`` (before filtering
with exact "on", after filtering with the on band eps_low/eps_high), ``sweep.md``/``sweep.json``/``figure4_sweep.png``
(the same statistics after re-filtering with each Q of ``--sweep-q`` at V = ``--v``), ``figure1_traces.png``
(raw, sequence-level and Kalman-filtered ratios of example responses) and ``figure1_dynamics.png`` (window-wise
off-policy frequency with a +-1 std band, run-length distributions, per-sample switch frequency).

Modules: ``dumps`` (the dump format: write_dump, load_dump), ``synthetic`` (a seeded trace set), ``compute``
(Table 2 and the sweep), ``report`` (the files), ``plots`` (the figures), ``cli`` (the command).
"""

from kpo.analysis.compute import Analysis, AnalyzeConfig, compute
from kpo.analysis.dumps import Dump, DumpError, find_dumps, load_dump, write_dump
from kpo.analysis.report import analyze
from kpo.analysis.synthetic import synthetic_dump, write_synthetic

__all__ = [
    "Analysis",
    "AnalyzeConfig",
    "Dump",
    "DumpError",
    "analyze",
    "compute",
    "find_dumps",
    "load_dump",
    "synthetic_dump",
    "write_dump",
    "write_synthetic",
]
