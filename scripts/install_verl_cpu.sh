#!/usr/bin/env bash
# Install kpo with verl 0.9.1 into a venv that already has a CPU torch, letting pip resolve every requirement of
# verl and of kpo's extras together: the environment a verl user gets, minus verl's GPU extras.
#
#   scripts/install_verl_cpu.sh [VENV]        # VENV defaults to .venv-verl; `make test` calls it
#
# - `pip install -e ".[dev,verl]"`: verl's own requirements with its `verl-core` extra (ray[default], tensordict,
#   transformers>=5.5.3,<5.11, peft, wandb, and fastapi/uvicorn/cachetools/pyzmq/TransferQueue/...: what every
#   verl install has, since verl[vllm], [sglang] and [fsdp] include verl-core; without it
#   `verl.workers.engine_workers`, which main_ppo's trainer imports, fails on uvicorn and cachetools) and all of
#   kpo's extras (trl 1.16, math-verify, numba, triton, ...) in one resolution, so pip picks a transformers
#   inside verl's range that TRL accepts too, and `pip check` must pass afterwards.
# - the installed torch is a pip constraint: verl's base requirements leave torch open, and nothing may replace
#   the CPU wheel with a multi-GB CUDA build. verl's `vllm`/`sglang`/`fsdp`/`megatron`/`cpu` extras pin torch
#   2.11 and are not installed here.
# - verl's wheel (and TransferQueue's, from verl-core) also installs its own test suite and dev scripts as
#   top-level `tests` and `scripts` packages; in site-packages they shadow or merge into every project's `tests`
#   (kpo's `from tests.losses import reference` then fails). The script deletes exactly the files those two
#   wheels' RECORDs list under those two names.
set -euo pipefail

VENV="${1:-.venv-verl}"
PY="$VENV/bin/python"
cd "$(dirname "$0")/.."

if [ ! -x "$PY" ]; then
    echo "install_verl_cpu: no python at $PY; create the venv and install a CPU torch first" \
         "('python3 -m venv $VENV && $PY -m pip install torch==2.13.0')" >&2
    exit 2
fi
TORCH_VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [ -z "$TORCH_VERSION" ]; then
    echo "install_verl_cpu: torch is not installed in $VENV; install the CPU wheel first" \
         "(e.g. '$PY -m pip install torch==2.13.0'), never let verl's requirements choose one" >&2
    exit 2
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
"$PY" -m pip install --quiet -c "$CONSTRAINTS" -e ".[dev,verl]"

"$PY" - <<'EOF'
import importlib.metadata as md
import os
from pathlib import Path

root = Path(md.distribution("verl").locate_file(""))  # site-packages
for name in ("verl", "TransferQueue"):
    dist = md.distribution(name)
    stray = [f for f in dist.files if f.parts[0] in ("tests", "scripts")]
    for f in stray:
        (root / f).unlink(missing_ok=True)
    print(f"install_verl_cpu: removed {name}'s top-level tests/ and scripts/ ({len(stray)} files) from site-packages")
# Then the directories left empty, bytecode caches included (another distribution's files keep theirs).
for top in ("tests", "scripts"):
    for dirpath, _, filenames in sorted(os.walk(root / top), key=lambda w: len(w[0]), reverse=True):
        if Path(dirpath).name == "__pycache__" and all(f.endswith(".pyc") for f in filenames):
            for f in filenames:
                os.unlink(os.path.join(dirpath, f))
        if not os.listdir(dirpath):
            os.rmdir(dirpath)
EOF

# Prove it: pip sees no broken requirement, torch is the one we had, and what the plugin uses imports.
"$PY" -m pip check
TORCH_VERSION="$TORCH_VERSION" "$PY" - <<'EOF'
import importlib.metadata as md
import os

import verl
import verl.trainer.ppo.core_algos  # noqa: F401
import verl.workers.config  # noqa: F401
import verl.workers.engine_workers  # noqa: F401  (needs verl-core's uvicorn and cachetools)

import kpo.integrations.verl  # noqa: F401

assert md.version("torch") == os.environ["TORCH_VERSION"], "torch changed during the verl install"
versions = ", ".join(f"{d} {md.version(d)}" for d in ("verl", "torch", "transformers", "trl"))
print(f"install_verl_cpu: {versions}")
EOF
