"""A TRL GRPO script that trains with KPO: TRL's own way of writing one (TrlParser, a config, a reward function,
trainer.train()), with GRPOConfig and GRPOTrainer swapped for kpo's and kpo's fields set (loss, loss_kwargs, ...).

    python examples/trl_script.py --use_cpu --output_dir runs/trl-kpo --max_steps 8 --steps_per_generation 4 \
        --max_completion_length 132 --loss kpo --loss_kwargs memory=matched
    python examples/trl_script.py --config my_run.yaml      # any GRPOConfig or kpo field, as TRL's scripts take it

(--steps_per_generation 4: 4 optimizer steps per generation batch, 3 of them off-policy, the paper's protocol;
TRL's default of 1 is on-policy, where every ratio is 1 and the losses agree. --max_completion_length 132: the task's
128-token responses and 4 more, what the embedded model's context holds.)

Every GRPOConfig flag works as in TRL (docs/train.md lists the few KPOTrainer refuses, and why); kpo's fields are
--loss, --loss_kwargs NAME=VALUE ..., --loss_agg_mode, --advantage, the rollout sampler's and --dump_ratios_every.
The model is the embedded tiny one on its running-sum task (warm-started and cached on first use, 2-4 minutes on 2
cores), or --model_name_or_path DIR with --task/--n_terms/--max_value picking the embedded task it trains on.
"""

from dataclasses import dataclass, field

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import TrlParser

from kpo.testbed.task import TaskConfig, load_split
from kpo.train import KPOConfig, KPOTrainer  # a GRPO script imports GRPOConfig and GRPOTrainer from trl here


@dataclass
class ScriptArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A checkpoint directory; None = the embedded tiny model's warm start."}
    )
    task: str = field(default="running", metadata={"help": "The embedded task: running or chain."})
    n_terms: int | None = field(default=None, metadata={"help": "Terms per problem; None = the task's."})
    max_value: int | None = field(default=None, metadata={"help": "Largest term; None = the task's."})


def main() -> None:
    script_args, training_args = TrlParser((ScriptArguments, KPOConfig)).parse_args_and_config()
    task = TaskConfig(kind=script_args.task, n_terms=script_args.n_terms, max_value=script_args.max_value)
    path = script_args.model_name_or_path
    if path is None:  # kpo train's warm start of this task (the same cache)
        from kpo.train import TrainConfig
        from kpo.train.run import model_path

        path = model_path(TrainConfig(task=task.kind, n_terms=task.n_terms, max_value=task.max_value))
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    dataset = Dataset.from_list(
        [{"prompt": row["prompt"], "answer": row["answer"]} for row in load_split("train", task=task)]
    )

    def correct(completions: list[str], answer: list[str], **_) -> list[float]:
        return [task.grade(completion, a) for completion, a in zip(completions, answer)]

    trainer = KPOTrainer(  # was GRPOTrainer
        model=model,
        reward_funcs=correct,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model()
    print(f"done: {training_args.loss}, {trainer.state.global_step} steps; model in {training_args.output_dir}")


if __name__ == "__main__":
    main()
