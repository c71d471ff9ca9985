"""The environment the plugin is tested in is one pip calls consistent: every requirement of verl 0.9.1
(with its verl-core extra) and of kpo's extras is met at once (``make test`` builds it:
scripts/install_verl_cpu.sh). Skips without verl."""

from __future__ import annotations

import importlib.metadata as md

import pytest

pytest.importorskip("verl", reason="verl not installed: `make test` runs this file in .venv-verl")
from packaging.requirements import Requirement  # noqa: E402

KPO_EXTRAS = ("fast", "train", "eval", "analyze", "gpu", "verl")


def _unmet(dist: str, extras: tuple[str, ...] = ()) -> list[str]:
    """Requirements of ``dist`` (its base ones and those of ``extras``) that the installed versions miss."""
    unmet = []
    for line in md.requires(dist) or []:
        req = Requirement(line)
        wanted = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras))
        if not wanted:
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (installed: {have})")
    return unmet


def test_verl_and_kpo_extras_requirements_all_met():
    # kpo[verl] asks for verl[verl-core] (what verl[vllm], [sglang] and [fsdp] bring): its requirements count too.
    unmet = [f"verl needs {r}" for r in _unmet("verl", ("verl-core",))] + [
        f"kpo needs {r}" for r in _unmet("kpo", KPO_EXTRAS)
    ]
    assert not unmet, (
        "verl is installed here, but not as pip resolves verl 0.9.1 + kpo's extras (e.g. verl added with "
        "--no-deps); run the verl tests in .venv-verl, which `make test` builds (`rm -rf .venv-verl` to rebuild "
        "it), and uninstall verl from this environment:\n" + "\n".join(unmet)
    )


def test_verl_trainer_workers_import():
    # main_ppo's trainer builds its actor/rollout workers from this module; bare `pip install verl` (no
    # verl-core extra) lacks uvicorn and cachetools and fails right here.
    import verl.workers.engine_workers  # noqa: F401
