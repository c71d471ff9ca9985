#!/usr/bin/env bash
# `kpo compare --engine verl` on a Ray cluster you start, each run a Ray job of it (Ray's job submission, as verl's
# multi-node recipe submits main_ppo): vanilla (GRPO), GSPO and KPO at the matched memory, Qwen3-4B on
# DAPO-Math-17k, scored on the six benchmarks. kpo[verl], verl and its GPU stack in the same environment on every
# node; the data, the model and OUT on a filesystem every node (and this one) mounts at the same path.
#
#   on the head node:   examples/verl/run_compare_on_cluster.sh head
#   on each other node: examples/verl/run_compare_on_cluster.sh worker HEAD_IP
#   on the head node:   NNODES=2 examples/verl/run_compare_on_cluster.sh compare [--plan] [kpo compare options]
#
# compare runs from the repository's root: runtime_env.yaml's working_dir (examples/verl, with reward.py) and OUT
# are read from there, as Ray and kpo read relative paths, from the directory they run in.
#
# The cluster keeps Ray's token authentication (Ray 2.60): `head` makes a token (~/.ray/auth_token) if there is
# none; copy it to every node (and wherever kpo compare runs) before `worker`. JOBS runs at once, each asking for
# NNODES x GPUS_PER_NODE GPUs; the cluster's scheduler queues the rest. A killed compare's jobs stop within
# KPO_RAY_LEASE_SECONDS (60); rerun the same command to resume.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD="${DASHBOARD:-http://127.0.0.1:8265}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
DATA="${DATA:-$HOME/data/kpo_verl}"
MODEL="${MODEL:-$HOME/models/Qwen3-4B}"
OUT="${OUT:-runs/qwen3-4b-dapo}"
export RAY_AUTH_MODE=token

case "${1:-}" in
    head)
        [ -s ~/.ray/auth_token ] || ray get-auth-token --generate
        ray start --head --port="$RAY_PORT" --dashboard-host=0.0.0.0 --num-gpus="$GPUS_PER_NODE" ;;
    worker)
        [ -n "${2:-}" ] || { echo "usage: $0 worker HEAD_IP" >&2; exit 2; }
        ray start --address="$2:$RAY_PORT" --num-gpus="$GPUS_PER_NODE" ;;
    compare)
        shift
        : "${NNODES:?set NNODES to the nodes one run takes}"
        cd "$HERE/../.."
        exec kpo compare --engine verl --ray-address "$DASHBOARD" --jobs "${JOBS:-1}" \
            --ray-runtime-env "$HERE/runtime_env.yaml" \
            --model "$MODEL" --dataset "$DATA/train.parquet" \
            --eval-data "$DATA/aime24.parquet" "$DATA/aime25.parquet" "$DATA/amc23.parquet" \
                "$DATA/math500.parquet" "$DATA/minerva.parquet" "$DATA/olympiadbench.parquet" --eval-n 16 \
            --methods vanilla,gspo --seeds 3 --no-ablations --aa-seeds 0 --steps 1200 --minibatches 4 \
            --dump-every 40 --out "$OUT" "$@" -- \
            data.val_files="$DATA/aime24.parquet" data.train_batch_size=32 data.max_prompt_length=2048 \
            data.max_response_length=4096 data.filter_overlong_prompts=True data.truncation=error \
            actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.model.use_remove_padding=True \
            actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.optim.lr=1e-6 \
            actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12288 \
            actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.entropy_coeff=0 \
            actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
            actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
            algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False \
            reward.custom_reward_function.path=reward.py reward.custom_reward_function.name=compute_score \
            trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE" trainer.logger=[console,tensorboard] \
            trainer.project_name=kpo trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=100 ;;
    *)
        echo "usage: $0 head | worker HEAD_IP | compare [kpo compare options]  (see the header of this script)" >&2
        exit 2 ;;
esac
