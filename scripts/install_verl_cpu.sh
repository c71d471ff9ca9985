#!/usr/bin/env bash
# Install verl 0.9.1 without its GPU stack into a venv that already has a CPU torch, so that
# `import verl`, verl.trainer.ppo.core_algos, verl.workers.config and verl's hydra config
# instantiation work on a laptop or CI machine (what tests/integrations needs).
#
#   scripts/install_verl_cpu.sh [VENV]        # VENV defaults to .venv
#
# What it does, and why:
# - verl==0.9.1 --no-deps: verl's own requirements pull its GPU-era pins (torch==2.11 in its extras,
#   ray[default], wandb, peft, ...) that a CPU test does not need.
# - then only the packages `import verl` + core_algos + actor config + hydra.utils import (found by importing
#   in a bare venv), each in verl 0.9.1's version range; hydra-core>=1.3 and omegaconf>=2.3 because verl's
#   configs need them (its metadata leaves them open, and pip would otherwise backtrack to 2019 releases).
# - nothing already installed changes: every installed distribution is a pip constraint at its current
#   version (torch included, so no CUDA build can replace it). The one exception is
#   antlr4-python3-runtime, which hydra-core/omegaconf pin to 4.9.*; math-verify supports 4.9.3, and the
#   script re-checks math-verify afterwards when it is installed.
# - verl's wheel also installs its own test suite and dev scripts as top-level `tests` and `scripts`
#   packages; in site-packages they shadow every project's `tests` (kpo's included: `from tests.x import y`
#   then fails). The script deletes exactly the files verl's RECORD lists under those two names.
# - a package that is present but outside verl's range (e.g. a newer transformers used by TRL) is kept and
#   reported: verl only needs it to import.
set -euo pipefail

VENV="${1:-.venv}"
PY="$VENV/bin/python"
VERL_SPEC="verl==0.9.1"

if [ ! -x "$PY" ]; then
    echo "install_verl_cpu: no python at $PY; create the venv and install a CPU torch first" >&2
    exit 2
fi

TORCH_VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [ -z "$TORCH_VERSION" ]; then
    echo "install_verl_cpu: torch is not installed in $VENV; install the CPU wheel first" \
         "(e.g. '$PY -m pip install torch==2.13.0'), never let verl's deps choose one" >&2
    exit 2
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
"$PY" -m pip freeze --exclude-editable | grep -v -e '^-e' -e '^#' -e ' @ ' -e '^antlr4-python3-runtime==' > "$CONSTRAINTS"

# Requirement -> import check, in verl 0.9.1's version ranges. ray without [default]: the dashboard
# extras are for a live cluster. orjson and codetiming are imported by verl.utils.profiler at
# import time of verl.workers.config.
MISSING="$("$PY" - <<'EOF'
import importlib.metadata as md

REQUIREMENTS = [
    ("packaging", "packaging>=20.0"),
    ("numpy", "numpy>=2.0.0"),
    ("ray", "ray>=2.41.0"),
    ("tensordict", "tensordict>=0.8.0,<=0.10.0,!=0.9.0"),
    ("omegaconf", "omegaconf>=2.3"),
    ("hydra-core", "hydra-core>=1.3"),
    ("codetiming", "codetiming"),
    ("orjson", "orjson"),
    ("transformers", "transformers>=5.5.3,<5.11,!=5.6.0"),
]
try:
    from packaging.requirements import Requirement
except ImportError:  # packaging itself is missing: every check below is a presence check only
    Requirement = None

missing = []
for dist, spec in REQUIREMENTS:
    try:
        have = md.version(dist)
    except md.PackageNotFoundError:
        missing.append(spec)
        continue
    if Requirement is not None and not Requirement(spec).specifier.contains(have, prereleases=True):
        print(f"install_verl_cpu: keeping {dist}=={have} (verl 0.9.1 asks {spec}; enough to import)",
              file=__import__("sys").stderr)
print(" ".join(missing))
EOF
)"

# pip's resolver lists verl's uninstalled requirements as "conflicts" here: expected with --no-deps.
"$PY" -m pip install --quiet --no-deps "$VERL_SPEC"
"$PY" - <<'EOF'
import importlib.metadata as md
import os
from pathlib import Path

dist = md.distribution("verl")
root = Path(dist.locate_file(""))  # site-packages
stray = [f for f in dist.files if f.parts[0] in ("tests", "scripts")]
for f in stray:
    (root / f).unlink(missing_ok=True)
# Then the directories left empty (another distribution's files there would keep theirs).
for top in ("tests", "scripts"):
    for dirpath, _, _ in sorted(os.walk(root / top), key=lambda w: len(w[0]), reverse=True):
        if not os.listdir(dirpath):
            os.rmdir(dirpath)
print(f"install_verl_cpu: removed verl's top-level tests/ and scripts/ ({len(stray)} files) from site-packages")
EOF
if [ -n "$MISSING" ]; then
    # shellcheck disable=SC2086  # MISSING is a space-separated list of requirement specs
    "$PY" -m pip install --quiet -c "$CONSTRAINTS" $MISSING
fi

# Prove it: the modules kpo's plugin and tests use must import, on the original torch.
TORCH_VERSION="$TORCH_VERSION" "$PY" - <<'EOF'
import importlib.metadata as md
import os

import hydra.utils  # noqa: F401  verl instantiates its dataclass configs through hydra
import verl
import verl.trainer.ppo.core_algos  # noqa: F401
import verl.utils.config  # noqa: F401
import verl.workers.config  # noqa: F401

assert md.version("torch") == os.environ["TORCH_VERSION"], "torch changed during the verl install"
try:
    from math_verify import parse, verify
except ImportError:
    pass
else:  # still grading after the antlr change (1/2 == 0.5 needs the LaTeX parser)
    assert verify(parse("$\\frac{1}{2}$"), parse("$0.5$")), "math-verify broke after the verl install"
print(f"install_verl_cpu: verl {verl.__version__} importable with torch {md.version('torch')}")
EOF
