#!/usr/bin/env bash
# The paper's KPO run (run_kpo_qwen3_4b.sh) on a multi-node Ray cluster. kpo, verl and its GPU stack must be
# installed in the same environment on every node (the plugin loads in every Ray worker at `import verl`).
#
#   on the head node:      examples/verl/run_kpo_qwen3_4b_multinode.sh head
#   on each other node:    examples/verl/run_kpo_qwen3_4b_multinode.sh worker HEAD_IP
#   then on the head node: NNODES=2 examples/verl/run_kpo_qwen3_4b_multinode.sh train [extra hydra overrides]
#
# train runs the single-node script with trainer.nnodes=NNODES; verl's driver joins the running cluster
# (RAY_ADDRESS=auto). Batch limits: 32 x 8 = 256 sequences per step must divide by NNODES x GPUS_PER_NODE,
# and a mini-batch of 8 x 8 = 64 sequences needs at most 64 data-parallel ranks, so the paper's batch sizes
# stop scaling at 64 GPUs; raise data.train_batch_size / ppo_mini_batch_size (extra overrides) beyond that.
# Data paths (DATA) must be readable from every node (shared filesystem), like the model path.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RAY_PORT="${RAY_PORT:-6379}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"

case "${1:-}" in
    head)
        ray start --head --port="$RAY_PORT" --num-gpus="$GPUS_PER_NODE" ;;
    worker)
        [ -n "${2:-}" ] || { echo "usage: $0 worker HEAD_IP" >&2; exit 2; }
        ray start --address="$2:$RAY_PORT" --num-gpus="$GPUS_PER_NODE" ;;
    train)
        shift
        : "${NNODES:?set NNODES to the number of nodes in the Ray cluster}"
        export RAY_ADDRESS="${RAY_ADDRESS:-auto}" NNODES GPUS_PER_NODE
        exec "$HERE/run_kpo_qwen3_4b.sh" "$@" ;;
    *)
        echo "usage: $0 head | worker HEAD_IP | train [overrides]  (see the header of this script)" >&2
        exit 2 ;;
esac
