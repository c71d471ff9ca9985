"""A generated batch that does not depend on the processes it is generated on, for comparing one optimizer step
on 1 and on N processes (tests/train/test_train_multiprocess.py).

Sampling cannot give one: each process draws from its own generator. So generation is replaced: the k-th
response to a prompt of the embedded chain task "a+b=" is the right sum when k is even and that sum with a "0"
appended (wrong, one token longer) when k is odd; each group then has rewards 1, 0, 1, 0 and responses of two
lengths. Run as a script (``python -m torch.distributed.run --nproc_per_node N tests/train/fixed_batch.py
CONFIG.yaml``) it trains ``CONFIG.yaml``'s run on that batch.
"""

from __future__ import annotations

import sys

from kpo.train.trainer import KPOTrainer


def fixed_responses(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    """``GRPOTrainer._generate_single_turn``'s result, (completion ids per row, no sampling log-probs), for the
    rows ``prompt_ids``: each prompt's num_generations copies are consecutive, and a process's rows hold whole
    groups, so a row's place in its group is its index modulo num_generations on any number of processes."""
    tokenizer = self.processing_class
    completions = []
    for i, ids in enumerate(prompt_ids):
        a, b = tokenizer.decode(ids, skip_special_tokens=True).rstrip("=").split("+")
        text = str(int(a) + int(b)) + ("0" if i % num_generations % 2 else "")
        completions.append(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
    return completions, None


if __name__ == "__main__":
    from kpo.train import run_training
    from kpo.train.config import TrainConfig

    KPOTrainer._generate_single_turn = fixed_responses
    run_training(TrainConfig.from_yaml(sys.argv[1]))
