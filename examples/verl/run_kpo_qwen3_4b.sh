#!/usr/bin/env bash
# The paper's KPO run on stock verl 0.9.1 + kpo's plugin: Qwen3-4B, DAPO-Math-17k, 32 prompts x 8 samples,
# mini-batch 8 prompts (4 optimizer steps per batch), lr 1e-6, responses up to 4096 tokens, GRPO advantages,
# no KL, seq-mean-token-mean, an FSDP2 actor, validation avg@16 on AIME24/AIME25/AMC23/MATH500/Minerva/
# OlympiadBench.
#
#   python examples/verl/prepare_data.py --out ~/data/kpo_verl     # once
#   examples/verl/run_kpo_qwen3_4b.sh [extra hydra overrides]        # one node, 8 GPUs
#
# Environment knobs (defaults in brackets):
#   DATA [~/data/kpo_verl]  MODEL [Qwen/Qwen3-4B]  NNODES [1]  GPUS_PER_NODE [8]
#   LOSS [kpo]: kpo (KPO-clipped, Q=1e-6) or kpo_unclipped (Q=1e-4); Q overrides the loss's paper value.
#   DRY_RUN=1: print the overrides, one per line, and exit (tests/integrations composes them with verl's config).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${DATA:-$HOME/data/kpo_verl}"
MODEL="${MODEL:-Qwen/Qwen3-4B}"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
LOSS="${LOSS:-kpo}"
case "$LOSS" in
    kpo) Q="${Q:-1e-6}" ;;
    kpo_unclipped) Q="${Q:-1e-4}" ;;
    *) echo "LOSS must be kpo or kpo_unclipped, got '$LOSS'" >&2; exit 2 ;;
esac
MAX_PROMPT=2048
MAX_RESPONSE=4096
VAL_FILES="[$DATA/aime24.parquet,$DATA/aime25.parquet,$DATA/amc23.parquet,$DATA/math500.parquet,$DATA/minerva.parquet,$DATA/olympiadbench.parquet]"

ARGS=(
    # data: 32 prompts per step; prompts longer than MAX_PROMPT tokens are dropped (counted in the log)
    "data.train_files=$DATA/train.parquet"
    "data.val_files=$VAL_FILES"
    data.train_batch_size=32
    "data.max_prompt_length=$MAX_PROMPT"
    "data.max_response_length=$MAX_RESPONSE"
    data.filter_overlong_prompts=True
    data.truncation=error
    # model, trained with FSDP2 (verl's fsdp2 strategy; the reference model follows the actor's): the strategy
    # kpo's end-to-end test runs verl's trainer with (tests/integrations/test_verl_e2e.py, on CPUs). verl's
    # default FSDP1 cannot run there (it hard-codes sync_module_states=True, a broadcast from a GPU), so it is
    # untested with kpo's losses; the loss itself is the same function under either strategy.
    "actor_rollout_ref.model.path=$MODEL"
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    # KPO: kpo's actor config carries q/v; clip range 3e-4/4e-4 (used by kpo, ignored by kpo_unclipped)
    actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig
    "actor_rollout_ref.actor.policy_loss.loss_mode=$LOSS"
    "+actor_rollout_ref.actor.q=$Q"
    +actor_rollout_ref.actor.v=1.0
    actor_rollout_ref.actor.clip_ratio_low=3e-4
    actor_rollout_ref.actor.clip_ratio_high=4e-4
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
    # optimisation: 8-prompt mini-batches = 4 optimizer steps per batch, 3 of them off-policy
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=8
    actor_rollout_ref.actor.ppo_epochs=1
    actor_rollout_ref.actor.use_dynamic_bsz=True
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(( 2 * (MAX_PROMPT + MAX_RESPONSE) ))"
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_coeff=0
    # rollout: 8 samples per prompt at temperature 1; validation avg@16 at temperature 1, top_p 1
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.top_p=1.0
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.val_kwargs.n=16
    actor_rollout_ref.rollout.val_kwargs.do_sample=True
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0
    actor_rollout_ref.rollout.val_kwargs.top_p=1.0
    # GRPO advantages (group mean/std), no KL anywhere, kpo's binary math reward
    algorithm.adv_estimator=grpo
    algorithm.norm_adv_by_std_in_grpo=True
    algorithm.use_kl_in_reward=False
    "reward.custom_reward_function.path=$HERE/reward.py"
    reward.custom_reward_function.name=compute_score
    # trainer: verl's v1 trainer on TransferQueue (verl 0.9.1's default, set here so a new default cannot change
    # it), the one kpo's end-to-end test runs with kpo's loss, bypass mode and IcePop included
    # (tests/integrations/test_verl_e2e.py). On a node with few cores see docs/verl.md: TransferQueue's storage
    # units and the worker slots need 2 + 8 + 3 x GPUs logical CPUs.
    trainer.use_v1=True
    "trainer.nnodes=$NNODES"
    "trainer.n_gpus_per_node=$GPUS_PER_NODE"
    "trainer.logger=[console,tensorboard]"
    trainer.project_name=kpo
    "trainer.experiment_name=qwen3_4b_dapo_${LOSS}_q${Q}"
    trainer.val_before_train=True
    trainer.test_freq=50
    trainer.save_freq=100
    trainer.total_epochs=1
)

if [ -n "${DRY_RUN:-}" ]; then
    printf '%s\n' "${ARGS[@]}" "$@"
    exit 0
fi
exec python3 -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
