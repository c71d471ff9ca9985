"""The ratio-dump format: its one writer (:func:`write_dump`) and its one reader (:func:`load_dump`).

A dump is one optimizer step's token log-ratios, as ``kpo train --dump-ratios-every N`` writes them to
``<run>/ratios/step_{N:06d}.safetensors``:
- tensors ``log_ratio`` float32 [B, T] (log pi_theta - log pi_old), ``filtered_log_ratio`` float32 [B, T] (its
  Kalman filter, in float64, at the settings below) and ``mask`` uint8 [B, T];
- string metadata ``step``, ``q``, ``v``, ``p0``, ``x0``, ``mask_mode`` (every filter setting, so ``kpo analyze``
  can re-filter exactly), and where known ``loss``, ``on_policy`` ("1" for the first optimizer step of a
  generation batch) and ``source``.
:func:`load_dump` also reads any ``.safetensors``/``.npz`` file holding at least ``log_ratio`` and ``mask``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kpo._files import replacing
from kpo.diagnostics import prepare

DUMP_SUFFIXES = (".safetensors", ".npz")
# a filter's settings, as kpo.losses.kpo.filter_settings gives them
FILTER_KEYS = ("q", "v", "p0", "x0", "mask_mode")


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


def write_dump(
    path: str | Path,
    log_ratio,
    mask,
    *,
    step: int,
    settings: Mapping[str, float | str],
    loss: str | None = None,
    on_policy: bool | None = None,
    source: str | None = None,
) -> Path:
    """Write one dump to ``path`` (a ``.safetensors`` file; folders are created).

    log_ratio: float [B, T] (numpy or CPU torch), 0 where masked; mask: bool/uint8 [B, T]; settings: the filter's
    q, v, p0, x0, mask_mode (:func:`kpo.losses.kpo.filter_settings`). ``filtered_log_ratio`` is computed here, in
    float64, so a dump's filtered ratios always match its metadata.
    """
    import torch
    from safetensors.numpy import save_file

    from kpo.filter import kalman_filter

    missing = [k for k in FILTER_KEYS if k not in settings]
    if missing:
        raise ValueError(f"write_dump: settings lack {missing}; give all of {FILTER_KEYS}")
    z = torch.as_tensor(np.asarray(log_ratio), dtype=torch.float64)
    m = torch.as_tensor(np.asarray(mask)).bool()
    if z.dim() != 2 or z.shape != m.shape:
        raise ValueError(
            f"write_dump: log_ratio {tuple(z.shape)} and mask {tuple(m.shape)} must both be [B, T]"
        )
    filt = {k: settings[k] for k in FILTER_KEYS}
    filtered = kalman_filter(z, m, **filt)
    meta = {"step": str(int(step)), "mask_mode": str(filt["mask_mode"])}
    meta.update({k: repr(float(filt[k])) for k in ("q", "v", "p0", "x0")})
    extra = {"loss": loss, "on_policy": None if on_policy is None else str(int(on_policy)), "source": source}
    meta.update({k: v for k, v in extra.items() if v is not None})
    path = Path(path)
    tensors = {
        "log_ratio": z.float().numpy(),
        "filtered_log_ratio": filtered.float().numpy(),
        "mask": m.to(torch.uint8).numpy(),
    }
    with replacing(path) as partial:  # whole or absent (kpo analyze reads every dump of a folder)
        save_file(tensors, str(partial), metadata=meta)
    return path


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
