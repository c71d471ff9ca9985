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

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kpo._checks import file_in_the_way
from kpo.diagnostics import STAT_KEYS, average_samples, prepare, run_lengths, sample_dynamics, window_stats
from kpo.filter import MASK_MODES

DUMP_SUFFIXES = (".safetensors", ".npz")
PAPER_TABLE2 = {  # Table 2 of the paper (Qwen3-4B, GRPO, step 100, 960 off-policy samples), for comparison
    "before": dict(zip(STAT_KEYS, (0.25, 0.22, 0.53, 1.64, 1.57, 3.53, 0.43, 0.12, 0.19, 0.15))),
    "after": dict(zip(STAT_KEYS, (0.35, 0.43, 0.22, 119.95, 135.12, 35.11, 0.01, 0.98, 1e-4, 1e-5))),
}
COLUMNS = {
    "prop_up": "prop up",
    "prop_down": "prop down",
    "prop_on": "prop on",
    "runlen_up": "run-len up",
    "runlen_down": "run-len down",
    "runlen_on": "run-len on",
    "switch_freq": "switch freq",
    "lfr": "LFR",
    "global_var": "glob. var",
    "local_var": "win. loc. var",
}


class DumpError(ValueError):
    """A ratio dump that cannot be analysed; the message names the file and the problem."""


@dataclass
class Dump:
    """One ratio dump. log_ratio, filtered: float64 [B, T] (filtered None if absent); mask: bool [B, T]."""

    path: Path
    log_ratio: np.ndarray
    mask: np.ndarray
    filtered: np.ndarray | None
    meta: dict[str, str] = field(default_factory=dict)

    def meta_float(self, key: str) -> float | None:
        if key not in self.meta:
            return None
        try:
            return float(self.meta[key])
        except ValueError:
            raise DumpError(f"{self.path}: metadata {key}={self.meta[key]!r} is not a number") from None


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
    off_policy_only: bool = False  # leave out on-policy rows (dump metadata on_policy=1, else log-ratios all 0)


# ----------------------------------------------------------------------------------------------- loading


def find_dumps(path: str | Path) -> list[Path]:
    """The dump files PATH names: the file itself, or every .safetensors/.npz in a folder (a run dir's ratios/)."""
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    folder = path / "ratios" if (path / "ratios").is_dir() else path
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DUMP_SUFFIXES)
    if not files:
        raise DumpError(
            f"{folder}: no ratio dumps (*.safetensors, *.npz) found; write some with "
            "`kpo train --dump-ratios-every N` or try `kpo analyze --synthetic`"
        )
    return files


def _read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="np") as f:
                meta = dict(f.metadata() or {})
                arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise DumpError(f"{path}: not a readable safetensors file ({exc})") from None
        return arrays, meta
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        except Exception as exc:
            raise DumpError(f"{path}: not a readable .npz file ({exc})") from None
        meta = {k: str(arrays.pop(k)) for k in list(arrays) if arrays[k].ndim == 0}
        return arrays, meta
    raise DumpError(f"{path}: unsupported file type {path.suffix!r}; expected one of {DUMP_SUFFIXES}")


def load_dump(path: str | Path) -> Dump:
    """Read and validate one dump; raises DumpError naming the file and what is wrong."""
    path = Path(path)
    arrays, meta = _read_arrays(path)
    for key in ("log_ratio", "mask"):
        if key not in arrays:
            raise DumpError(
                f"{path}: missing tensor {key!r} (the file has {sorted(arrays) or 'no tensors'}); a dump needs "
                "log_ratio [B, T], mask [B, T] and optionally filtered_log_ratio [B, T]"
            )
    shapes = {k: tuple(arrays[k].shape) for k in ("log_ratio", "mask", "filtered_log_ratio") if k in arrays}
    if len(shapes["log_ratio"]) not in (1, 2):
        raise DumpError(f"{path}: log_ratio must be [B, T] (or [T]), got shape {shapes['log_ratio']}")
    for key, shape in shapes.items():
        if shape != shapes["log_ratio"]:
            raise DumpError(
                f"{path}: shape mismatch: {key} is {shape} but log_ratio is {shapes['log_ratio']}"
            )
    try:
        z, m = prepare(arrays["log_ratio"], arrays["mask"], name="log_ratio")
        filtered = None
        if "filtered_log_ratio" in arrays:
            filtered, _ = prepare(arrays["filtered_log_ratio"], m, name="filtered_log_ratio")
    except (ValueError, TypeError) as exc:
        raise DumpError(f"{path}: {exc}") from None
    dump = Dump(path=path, log_ratio=z, mask=m, filtered=filtered, meta=meta)
    for key in ("q", "v", "p0", "x0"):  # fail now, not after the first figures
        dump.meta_float(key)
    return dump


def _pad(a: np.ndarray, T: int) -> np.ndarray:
    return np.pad(a, ((0, 0), (0, T - a.shape[1]))) if a.shape[1] < T else a


# ----------------------------------------------------------------------------------------------- synthetic


def synthetic_dump(
    *, seed: int = 0, samples: int = 64, length: int = 1024, q: float = 1e-6, v: float = 1.0
) -> dict[str, np.ndarray]:
    """A documented synthetic trace set shaped like a training dump (right padded, with masked holes).

    Per response b (seeded numpy Generator):
    - length n_b uniform in [length // 4, length]; positions >= n_b are padding (mask 0, value 0);
    - a slow latent drift rho_t: AR(1) with coefficient 0.995 and innovation std 0.005 (stationary std 0.05),
      started from its stationary law;
    - heavy-tailed token noise: Student-t with 3 degrees of freedom, scaled by 0.2;
    - "confident" tokens whose log-ratio is exactly 0 (both policies near-certain, as bf16 training produces),
      chosen with probability 0.6 - 0.3 t / length, so off-policy tokens grow more frequent along the response
      as the paper's Figure 1 reports; every other token is z_t = rho_t + noise_t;
    - in a quarter of the responses one masked hole of 5 to 20 tokens inside the response (a tool output in a
      multi-turn rollout): mask 0, value 0.
    ``filtered_log_ratio`` is :func:`kpo.kalman_filter` of it at (q, v), mask_mode "skip".
    Returns {"log_ratio": float32 [B, T], "filtered_log_ratio": float32 [B, T], "mask": uint8 [B, T]}.
    """
    import torch

    from kpo import kalman_filter

    rng = np.random.default_rng(seed)
    B, T = samples, length
    n = rng.integers(max(1, T // 4), T + 1, size=B)
    pos = np.arange(T)[None, :]
    mask = pos < n[:, None]
    coef, innov = 0.995, 0.005
    drift = np.empty((B, T))
    drift[:, 0] = rng.normal(0.0, innov / math.sqrt(1 - coef**2), size=B)
    shocks = rng.normal(0.0, innov, size=(B, T))
    for t in range(1, T):  # generator only (not an analysis path): one vectorized step per position
        drift[:, t] = coef * drift[:, t - 1] + shocks[:, t]
    z = drift + 0.2 * rng.standard_t(3, size=(B, T))
    z[rng.random((B, T)) < 0.6 - 0.3 * pos / T] = 0.0
    for b in np.flatnonzero(rng.random(B) < 0.25):
        width = int(rng.integers(5, 21))
        if n[b] > width + 2:
            start = int(rng.integers(1, n[b] - width))
            mask[b, start : start + width] = False
    z[~mask] = 0.0
    filtered = kalman_filter(torch.from_numpy(z), torch.from_numpy(mask), q=q, v=v, mask_mode="skip").numpy()
    return {
        "log_ratio": z.astype(np.float32),
        "filtered_log_ratio": filtered.astype(np.float32),
        "mask": mask.astype(np.uint8),
    }


def write_synthetic(folder: str | Path, *, seed: int = 0, samples: int = 64, length: int = 1024) -> Path:
    """Write :func:`synthetic_dump` as ``folder/ratios/step_000000.safetensors`` (the trainer's format)."""
    from safetensors.numpy import save_file

    path = Path(folder) / "ratios" / "step_000000.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    q, v = 1e-6, 1.0
    tensors = synthetic_dump(seed=seed, samples=samples, length=length, q=q, v=v)
    meta = {
        "step": "0",
        "q": repr(q),
        "v": repr(v),
        "source": f"kpo analyze --synthetic (seed={seed}, samples={samples}, length={length})",
    }
    save_file(tensors, str(path), metadata=meta)
    return path


# ----------------------------------------------------------------------------------------------- analysis


def _filter(z: np.ndarray, m: np.ndarray, q: float, v: float, mask_mode: str, p0: float, x0: float) -> np.ndarray:
    import torch

    from kpo import kalman_filter

    clean = np.where(m, z, 0.0)  # masked entries are never observed; keep stray values out of any fast path
    out = kalman_filter(torch.from_numpy(clean), torch.from_numpy(m), q=q, v=v, p0=p0, x0=x0, mask_mode=mask_mode)
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
    from tqdm.auto import tqdm

    T = max(d.log_ratio.shape[1] for d in dumps)
    zs, ms, fs, rows_meta = [], [], [], []
    for d in tqdm(dumps, desc="filter dumps", disable=len(dumps) < 2):
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
            filtered, source = _filter(d.log_ratio, d.mask, q, v, mask_mode, p0, x0), "recomputed"
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
    for q in tqdm(cfg.sweep_q, desc="Q/V sweep"):
        stats = _stats(_filter(z, m, q, v_sweep, sweep_mode, p0, x0), m, cfg, band=True)[0]
        sweep["rows"].append({"q": q, "q_over_v": q / v_sweep, **stats})

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


def analyze(dumps: list[Dump], cfg: AnalyzeConfig, out: str | Path) -> dict:
    """Run the whole analysis on ``dumps`` and write every output into ``out``; returns the results dict."""
    from kpo import analysis_plots

    a = compute(dumps, cfg)
    results, z, m, filt = a.results, a.z, a.m, a.filt
    before, after, after_label = results["before"], results["after"], results["after_label"]
    sweep, v_sweep = results["sweep"]["rows"], results["sweep"]["v"]
    n = m.sum(axis=1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = _markdown_table(
        [
            ("Before KF (exact on, r = 1)", before),
            (f"{after_label}, on band [1-{cfg.eps_low:g}, 1+{cfg.eps_high:g}]", after),
            ("Paper before KF (Qwen3-4B, GRPO step 100)", PAPER_TABLE2["before"]),
            ("Paper after KF", PAPER_TABLE2["after"]),
        ]
    )
    (out / "table2.md").write_text(table)
    table2 = {k: v for k, v in results.items() if k != "sweep"}
    (out / "table2.json").write_text(json.dumps(_jsonable(table2), indent=2) + "\n")
    sweep_rows = [("Before KF (exact on)", before)] + [
        (f"Q/V = {r['q_over_v']:g} (Q={r['q']:g}, V={v_sweep:g})", r) for r in sweep
    ]
    (out / "sweep.md").write_text(_markdown_table(sweep_rows))
    sweep_json = {
        **results["sweep"],
        "eps_low": cfg.eps_low,
        "eps_high": cfg.eps_high,
        "before": before,
    }
    (out / "sweep.json").write_text(json.dumps(_jsonable(sweep_json), indent=2) + "\n")

    examples = np.lexsort((np.arange(len(n)), -n))[: cfg.examples]
    examples = examples[n[examples] > 0]
    figures = {
        "figure1_traces.png": analysis_plots.traces(
            z[examples],
            filt[examples],
            m[examples],
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            title=after_label,
            path=out / "figure1_traces.png",
        ),
        "figure1_dynamics.png": analysis_plots.dynamics(
            window_before=window_stats(z, m, window=cfg.window, max_windows=cfg.max_windows),
            window_after=window_stats(
                filt,
                m,
                eps_low=cfg.eps_low,
                eps_high=cfg.eps_high,
                window=cfg.window,
                max_windows=cfg.max_windows,
            ),
            runs_before=run_lengths(z, m),
            runs_after=run_lengths(filt, m, eps_low=cfg.eps_low, eps_high=cfg.eps_high),
            switch_before=a.per_before["switch_freq"],
            switch_after=a.per_after["switch_freq"],
            window=cfg.window,
            path=out / "figure1_dynamics.png",
        ),
        "figure4_sweep.png": analysis_plots.sweep(before, sweep, path=out / "figure4_sweep.png"),
    }
    (out / "report.md").write_text(_report(results, table, _markdown_table(sweep_rows), figures, cfg))
    return results


# ----------------------------------------------------------------------------------------------- writing


def _fmt(key: str, value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if key.endswith("_var"):
        return f"{value:.2e}"
    if key.startswith("runlen"):
        return f"{value:.2f}"
    return f"{value:.3f}"


def _markdown_table(rows: list[tuple[str, dict]]) -> str:
    head = "| | " + " | ".join(COLUMNS.values()) + " |\n"
    head += "|---|" + "---:|" * len(COLUMNS) + "\n"
    body = "".join(f"| {label} | " + " | ".join(_fmt(k, s[k]) for k in COLUMNS) + " |\n" for label, s in rows)
    return head + body


def _jsonable(obj):
    """NaN -> None (strict JSON), numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return None if math.isnan(obj) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _report(results: dict, table: str, sweep_table: str, figures: dict, cfg: AnalyzeConfig) -> str:
    inp = results["inputs"]
    lines = [
        "# Token dynamics of importance ratios (kpo analyze)",
        "",
        f"{inp['samples']} samples, {inp['valid_tokens']} valid tokens from {len(inp['files'])} dump(s):",
        "",
    ]
    for r in inp["files"]:
        lines.append(
            f"- `{r['file']}` (step {r['step']}): {r['rows_used']}/{r['rows']} rows used, {r['empty_rows']} empty, "
            f"{r['on_policy_rows']} on-policy; filtered: {r['filtered']} "
            f"(Q={r['q']:g}, V={r['v']:g}, mask_mode {r['mask_mode']})"
            + (f"; loss {r['loss']}" if r["loss"] else "")
        )
    if inp["on_policy_rows"] and not cfg.off_policy_only:
        lines += [
            "",
            f"Note: {inp['on_policy_rows']} on-policy rows are included; the paper uses off-policy samples only "
            "(rerun with `--off-policy-only`).",
        ]
    lines += [
        "",
        "## Table 2: before and after Kalman filtering",
        "",
        f"Window {cfg.window}, k_c = floor({cfg.lf_cutoff:g} n), LFR and variances of the {cfg.signal}. "
        "Every value is a per-sample statistic averaged over samples (definitions: `kpo.diagnostics`).",
        "",
        table,
    ]
    if results["per_dump"]:
        lines += [
            "### Per dump",
            "",
            "| file | step | samples | "
            + " | ".join(f"{COLUMNS[k]} before / after" for k in ("prop_on", "switch_freq", "lfr"))
            + " |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in results["per_dump"]:
            cells = " | ".join(
                f"{_fmt(k, r['before'][k])} / {_fmt(k, r['after'][k])}"
                for k in ("prop_on", "switch_freq", "lfr")
            )
            lines.append(f"| `{Path(r['file']).name}` | {r['step']} | {r['rows_used']} | {cells} |")
        lines.append("")
    lines += [
        "## Figure 4 (offline): the same statistics after filtering at each Q/V",
        "",
        f"mask_mode {results['sweep']['mask_mode']}, on band [1-{cfg.eps_low:g}, 1+{cfg.eps_high:g}].",
        "",
        sweep_table,
        "![Q/V sweep](figure4_sweep.png)",
        "",
        "## Figure 1",
        "",
        "![traces](figure1_traces.png)",
        "",
        "![dynamics](figure1_dynamics.png)",
        "",
        "Files: "
        + ", ".join(f"`{f}`" for f in ["table2.md", "table2.json", "sweep.md", "sweep.json", *figures]),
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- command


def parse_q_values(text: str) -> tuple[float, ...]:
    """argparse type of a Q/V sweep: comma-separated positive numbers, e.g. ``1e-6,1e-4,1e-2``."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not (x > 0) for x in values):
        raise argparse.ArgumentTypeError(f"expected positive Q values, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    d = AnalyzeConfig()
    p = argparse.ArgumentParser(
        prog="kpo analyze",
        description="Token-dynamics analysis of importance-ratio dumps: the paper's Table 2, Figure 1 and an "
        "offline Figure 4 (Q/V sweep). Definitions: kpo.diagnostics.",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="dump file(s), run dir(s) or ratios/ folder(s)")
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="analyse a seeded synthetic trace set (kpo.analysis.synthetic_dump)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --synthetic (default 0)")
    p.add_argument("--samples", type=int, default=64, help="responses in --synthetic (default 64)")
    p.add_argument(
        "--length", type=int, default=1024, help="max response length in --synthetic (default 1024)"
    )
    p.add_argument("--out", type=Path, help="output folder (default: <PATH>/analysis, or ./kpo-analysis)")
    p.add_argument(
        "--eps-low", type=float, default=d.eps_low, help="on band after KF, below 1 (default 3e-4)"
    )
    p.add_argument(
        "--eps-high", type=float, default=d.eps_high, help="on band after KF, above 1 (default 4e-4)"
    )
    p.add_argument("--window", type=int, default=d.window, help="window in valid tokens (default 50)")
    p.add_argument("--lf-cutoff", type=float, default=d.lf_cutoff, help="k_c = floor(x * n) (default 0.1)")
    p.add_argument("--signal", choices=("log_ratio", "ratio"), default=d.signal, help="LFR/variance values")
    p.add_argument(
        "--q", type=float, default=None, help="re-filter at this Q (default: dump's filtered ratios)"
    )
    p.add_argument(
        "--v", type=float, default=None, help="re-filter at this V; also the sweep's V (default 1)"
    )
    p.add_argument(
        "--sweep-q", type=parse_q_values, default=d.sweep_q, help="Q values of the sweep (1e-6,1e-4,1e-2)"
    )
    p.add_argument(
        "--mask-mode",
        choices=MASK_MODES,
        default=None,
        help="kalman_filter mask_mode when re-filtering (default: the dump's, else skip); setting it re-filters",
    )
    p.add_argument("--examples", type=int, default=d.examples, help="responses in figure1_traces.png (3)")
    p.add_argument("--max-windows", type=int, default=d.max_windows, help="Figure 1 windows per sample (80)")
    p.add_argument(
        "--off-policy-only",
        action="store_true",
        help="leave out on-policy rows (dump metadata on_policy=1, else rows with all log-ratios exactly 0)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.synthetic == bool(args.paths):
        parser.error("give PATH(s) to dumps, or --synthetic (not both)")
    if args.examples < 1 or args.samples < 1 or args.length < 2:
        parser.error("--examples and --samples must be >= 1 and --length >= 2")
    cfg = AnalyzeConfig(
        eps_low=args.eps_low,
        eps_high=args.eps_high,
        window=args.window,
        lf_cutoff=args.lf_cutoff,
        signal=args.signal,
        q=args.q,
        v=args.v,
        sweep_q=args.sweep_q,
        mask_mode=args.mask_mode,
        examples=args.examples,
        max_windows=args.max_windows,
        off_policy_only=args.off_policy_only,
    )
    if args.synthetic:
        out = args.out or Path("kpo-analysis")
    else:
        base = Path(args.paths[0]) if Path(args.paths[0]).is_dir() else Path(args.paths[0]).parent
        out = args.out or ((base.parent if base.name == "ratios" else base) / "analysis")
    # Checked before any work: a file in the way used to end in a FileExistsError/NotADirectoryError traceback.
    existing = file_in_the_way(out)
    if existing is not None:
        print(f"kpo analyze: error: output folder {str(out)!r}: {str(existing)!r} is a file, not a folder; "
              "give another --out", file=sys.stderr)  # fmt: skip
        return 2
    try:
        if args.synthetic:
            dump_path = write_synthetic(
                out / "synthetic", seed=args.seed, samples=args.samples, length=args.length
            )
            print(f"synthetic trace set written to {dump_path}")
            files = [dump_path]
        else:
            files = [f for p in args.paths for f in find_dumps(p)]
        dumps = [load_dump(f) for f in files]
        results = analyze(dumps, cfg, out)
    except (DumpError, ValueError) as exc:
        print(f"kpo analyze: error: {exc}", file=sys.stderr)
        return 2
    print(_markdown_table([("Before KF", results["before"]), (results["after_label"], results["after"])]))
    print(f"report: {Path(out) / 'report.md'}")
    return 0


__all__ = [
    "Analysis",
    "AnalyzeConfig",
    "Dump",
    "DumpError",
    "analyze",
    "compute",
    "find_dumps",
    "load_dump",
    "main",
    "synthetic_dump",
    "write_synthetic",
]
