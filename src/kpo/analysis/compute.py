"""Table 2 and the Q/V sweep of ``kpo analyze``, computed from pooled dumps.

Choices the paper leaves open (the statistics' own choices are in :mod:`kpo.diagnostics`):
- "after filtering" uses the dump's ``filtered_log_ratio`` when present, i.e. what training used. Without it, or
  when any of ``--q``/``--v``/``--mask-mode`` is given, the log-ratios are filtered here with
  :func:`kpo.kalman_filter`; each setting comes from the option, else the dump's metadata, else Q = 1e-6, V = 1,
  mask_mode "skip" (a masked hole is no time step); p0 and x0 come from the metadata, else 0. The sweep uses
  V = ``--v`` (else 1) and the dumps' common mask_mode (else "skip") and p0, x0 (else 0, 0).
- the paper uses off-policy samples only. On-policy rows (a dump whose metadata says ``on_policy=1``, as the
  trainer writes for the first optimizer step of a generation batch; without that key, rows whose valid
  log-ratios are all exactly 0) are counted and reported; ``--off-policy-only`` leaves them out as the paper
  does.
- example responses for Figure 1 are the ``--examples`` longest rows (ties: the earlier row).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kpo._progress import progress_bar
from kpo.analysis.dumps import Dump, DumpError
from kpo.diagnostics import STAT_KEYS, average_samples, sample_dynamics
from kpo.filter import MASK_MODES

PAPER_TABLE2 = {  # Table 2 of the paper (Qwen3-4B, GRPO, step 100, 960 off-policy samples), for comparison
    "before": dict(zip(STAT_KEYS, (0.25, 0.22, 0.53, 1.64, 1.57, 3.53, 0.43, 0.12, 0.19, 0.15))),
    "after": dict(zip(STAT_KEYS, (0.35, 0.43, 0.22, 119.95, 135.12, 35.11, 0.01, 0.98, 1e-4, 1e-5))),
}


@dataclass
class AnalyzeConfig:
    """Settings of one analysis; every field is a command-line option of the same name."""

    eps_low: float = 3e-4  # on band after filtering: r >= 1 - eps_low (paper App. C.1)
    eps_high: float = 4e-4  # on band after filtering: r <= 1 + eps_high
    window: int = 50  # switch-frequency, local-variance and Figure 1 window, in valid tokens
    lf_cutoff: float = 0.1  # k_c = floor(lf_cutoff * n) for the low-frequency ratio
    signal: str = "log_ratio"  # values of lfr and the variances: "log_ratio" or "ratio"
    q: float | None = None  # filter Q when re-filtering (None: dump metadata, else 1e-6)
    v: float | None = None  # filter V when re-filtering (None: dump metadata, else 1.0)
    sweep_q: tuple[float, ...] = (1e-6, 1e-4, 1e-2)  # Figure 4's Q/V values
    mask_mode: str | None = (
        None  # kalman_filter mask_mode when re-filtering (None: dump metadata, else "skip")
    )
    examples: int = 3  # responses drawn in figure1_traces.png
    max_windows: int = 80  # Figure 1 windows per sample
    off_policy_only: bool = False  # leave out on-policy rows (metadata on_policy=1, else log-ratios all 0)


def _pad(a: np.ndarray, T: int) -> np.ndarray:
    return np.pad(a, ((0, 0), (0, T - a.shape[1]))) if a.shape[1] < T else a


def _refilter(
    z: np.ndarray, m: np.ndarray, q: float, v: float, mask_mode: str, p0: float, x0: float
) -> np.ndarray:
    import torch

    from kpo import kalman_filter

    clean = np.where(m, z, 0.0)  # masked entries are never observed; keep stray values out of any fast path
    out = kalman_filter(
        torch.from_numpy(clean), torch.from_numpy(m), q=q, v=v, p0=p0, x0=x0, mask_mode=mask_mode
    )
    return out.numpy().astype(np.float64)


def _stats(z: np.ndarray, m: np.ndarray, cfg: AnalyzeConfig, *, band: bool) -> tuple[dict, dict]:
    """(means over samples, per-sample arrays) of z with the after-filtering band (band) or exact on."""
    eps = dict(eps_low=cfg.eps_low, eps_high=cfg.eps_high) if band else {}
    per = sample_dynamics(z, m, window=cfg.window, lf_cutoff=cfg.lf_cutoff, signal=cfg.signal, **eps)
    return average_samples(per), per


@dataclass
class Analysis:
    """What :func:`compute` found. z, filt: float64 [B, T] raw and filtered log-ratios of all used rows (0 where
    masked); m: bool [B, T]; per_before/per_after: :func:`kpo.diagnostics.sample_dynamics` of each; results: the
    JSON-ready summary (before, after, sweep, inputs, settings, per_dump)."""

    results: dict
    z: np.ndarray
    m: np.ndarray
    filt: np.ndarray
    per_before: dict
    per_after: dict


def compute(dumps: list[Dump], cfg: AnalyzeConfig) -> Analysis:
    """Pool the rows of ``dumps``, filter where needed, and compute Table 2, the Q/V sweep and per-dump rows."""
    T = max(d.log_ratio.shape[1] for d in dumps)
    zs, ms, fs, rows_meta = [], [], [], []
    bar = progress_bar(len(dumps), "read dumps", "dumps", enabled=len(dumps) > 1)
    for d in dumps:
        q = next(x for x in (cfg.q, d.meta_float("q"), 1e-6) if x is not None)
        v = next(x for x in (cfg.v, d.meta_float("v"), 1.0) if x is not None)
        mask_mode = cfg.mask_mode or d.meta.get("mask_mode") or "skip"
        if mask_mode not in MASK_MODES:
            raise DumpError(f"{d.path}: metadata mask_mode={mask_mode!r} is not one of {MASK_MODES}")
        # the run's own initial variance and state (older dumps lack them: the paper's 0, 0)
        p0, x0 = (d.meta_float(key) or 0.0 for key in ("p0", "x0"))
        if d.filtered is not None and cfg.q is None and cfg.v is None and cfg.mask_mode is None:
            filtered, source = d.filtered, "dump"
        else:
            filtered, source = _refilter(d.log_ratio, d.mask, q, v, mask_mode, p0, x0), "recomputed"
        z, m = d.log_ratio, d.mask
        n = m.sum(axis=1)
        # the trainer records whether its step was on-policy; other dumps: rows whose log-ratios are all 0
        flag = d.meta.get("on_policy")
        if flag not in (None, "0", "1"):
            raise DumpError(f"{d.path}: metadata on_policy={flag!r} must be 0 or 1")
        on_policy = (n > 0) & (flag == "1" if flag is not None else ~(m & (z != 0)).any(axis=1))
        keep = ~on_policy if cfg.off_policy_only else np.ones(len(n), dtype=bool)
        zs.append(_pad(np.where(m, z, 0.0)[keep], T))
        ms.append(_pad(m[keep], T))
        fs.append(_pad(np.where(m, filtered, 0.0)[keep], T))
        rows_meta.append(
            {
                "file": str(d.path),
                "step": d.meta.get("step"),
                "rows": int(len(n)),
                "rows_used": int(keep.sum()),
                "empty_rows": int((n == 0).sum()),
                "on_policy_rows": int(on_policy.sum()),
                "valid_tokens": int(n[keep].sum()),
                "filtered": source,
                "q": q,
                "v": v,
                "p0": p0,
                "x0": x0,
                "mask_mode": mask_mode,
                "loss": d.meta.get("loss"),
            }
        )
        bar.update()
    bar.close()
    z, m, filt = np.concatenate(zs), np.concatenate(ms), np.concatenate(fs)
    n = m.sum(axis=1)
    if not (n > 0).any():
        raise DumpError(
            "no valid token to analyse in "
            + ", ".join(r["file"] for r in rows_meta)
            + (" (all rows are on-policy and --off-policy-only is set)" if cfg.off_policy_only else "")
        )
    before, per_before = _stats(z, m, cfg, band=False)
    after, per_after = _stats(filt, m, cfg, band=True)
    per_dump = []
    if len(dumps) > 1:
        start = 0
        for meta, zz in zip(rows_meta, zs):
            sl = slice(start, start + zz.shape[0])
            start = sl.stop
            if (n[sl] > 0).any():
                per_dump.append(
                    {
                        **meta,
                        "before": _stats(z[sl], m[sl], cfg, band=False)[0],
                        "after": _stats(filt[sl], m[sl], cfg, band=True)[0],
                    }
                )

    v_sweep = cfg.v if cfg.v is not None else 1.0
    modes = {r["mask_mode"] for r in rows_meta}
    sweep_mode = cfg.mask_mode or (modes.pop() if len(modes) == 1 else "skip")
    starts = {(r["p0"], r["x0"]) for r in rows_meta}  # the dumps' common p0, x0, else the paper's 0, 0
    p0, x0 = starts.pop() if len(starts) == 1 else (0.0, 0.0)
    sweep = {"v": v_sweep, "mask_mode": sweep_mode, "p0": p0, "x0": x0, "rows": []}
    bar = progress_bar(len(cfg.sweep_q), "Q/V sweep", "filters")
    for q in cfg.sweep_q:
        stats = _stats(_refilter(z, m, q, v_sweep, sweep_mode, p0, x0), m, cfg, band=True)[0]
        sweep["rows"].append({"q": q, "q_over_v": q / v_sweep, **stats})
        bar.update()
    bar.close()

    qs = sorted({r["q"] for r in rows_meta})
    vs = sorted({r["v"] for r in rows_meta})
    after_label = (
        f"After KF (Q={qs[0]:g}, V={vs[0]:g})" if len(qs) == 1 and len(vs) == 1 else "After KF (mixed Q/V)"
    )
    inputs = {
        "files": rows_meta,
        "samples": int((n > 0).sum()),
        "valid_tokens": int(n.sum()),
        "on_policy_rows": int(sum(r["on_policy_rows"] for r in rows_meta)),
    }
    settings = asdict(cfg)
    settings["sweep_q"] = list(cfg.sweep_q)
    results = {
        "before": before,
        "after": after,
        "after_label": after_label,
        "paper": PAPER_TABLE2,
        "inputs": inputs,
        "settings": settings,
        "per_dump": per_dump,
        "sweep": sweep,
    }
    return Analysis(results, z, m, filt, per_before, per_after)
