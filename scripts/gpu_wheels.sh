#!/usr/bin/env bash
# The wheels `kpo train` needs on the lent GPU machine whose image lacks them (it has torch, triton,
# transformers, accelerate, pandas, pyarrow, huggingface-hub and numba; ../.library/device/KINDS.md lists it):
# trl, datasets and datasets' dill and multiprocess, all pure Python, at the versions `make install` resolved
# here, into DEST (default .whl/, git-ignored) for benchmarks/bench_filter_gpu.py; see its docstring for the
# device command that installs them there.
set -euo pipefail
dest=${1:-.whl}
py=${PYTHON:-.venv/bin/python}
specs=()
for name in trl datasets dill multiprocess; do
  specs+=("$name==$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform any -d "$dest" "${specs[@]}"
ls -l "$dest"
