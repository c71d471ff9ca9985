"""The embedded tiny model's supervised warm start (:mod:`kpo.testbed.tiny` builds the model), cached on disk.

The warm start imitates a teacher that errs in a set share of steps, so the model starts at a moderate reward
and RL has room to improve it. On the running-sum task it is checked before it is cached: its exact expected
accuracy on validation problems (:mod:`kpo.evaluation.expected`) must lie in the preset's band and every
position's accuracy reach its floor; otherwise it trains another round on fresh problems, so what a seed gets is
a property of the settings, not of the CPU's float rounding. A warm-start example longer than the model's context
is an error, never a silent cut. The cache key covers everything that changes the result (model shape, task, SFT
settings, seed and the library versions), so a stale checkpoint is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from kpo.testbed.task import ALPHABET, TaskConfig, load_split, noisy_solve
from kpo.testbed.tiny import TinyModelConfig, build_model, build_tokenizer

__all__ = [
    "SFTSettings",
    "SFT_PRESETS",
    "accuracy_band",
    "check_warm_start",
    "default_cache_dir",
    "sft_problems",
    "warm_start",
]


@dataclass(frozen=True)
class SFTSettings:
    """Supervised warm start on reference solutions (TRL SFTTrainer).

    Attributes:
        n_examples: distinct training problems.
        epochs: passes over them; each pass draws fresh teacher noise, so the model learns the teacher's
            error rate rather than memorising particular wrong answers.
        noise: per-step error probability of the teacher (``kpo.testbed.task.noisy_solve``); it sets the
            warm-started model's reward, leaving RL room to sharpen it.
        learning_rate: AdamW learning rate (linear decay, no warm-up).
        batch_size: sequences per optimizer step.
        warmup_ratio: share of the optimizer steps with a linear learning-rate warm-up.
        band: (low, high) that the warm start's exact expected accuracy on :data:`VALIDATION_PROBLEMS`
            validation problems, as a multiple of the teacher's own (``(1 - noise) ** n_terms``: the accuracy
            of a model that learnt the teacher exactly), must lie in (``None``: no check; the running task only,
            where one response is right). The default (0.55, 1.25) is 15.2-34.5% at 128 terms.
        min_position_accuracy: the least mean probability of the right token at any response position (the
            end token included) the warm start must reach; ``None``: no floor.
        max_rounds: SFT rounds at most, each on ``n_examples`` fresh problems, until the checks pass; a warm
            start that fails them after the last round is an error, never cached.
    """

    n_examples: int = 200
    epochs: int = 40
    noise: float = 0.3
    learning_rate: float = 3e-3
    batch_size: int = 32
    warmup_ratio: float = 0.0
    band: tuple[float, float] | None = None
    min_position_accuracy: float | None = None
    max_rounds: int = 1


# Each task kind's warm start. running: 400 steps of 32 fresh problems from a teacher that errs in 1% of steps,
# so a 128-step response is fully right about 0.99^128 = 28% of the time at temperature 1. The rule is learnt
# abruptly between steps 200 and 400 (after 200 steps, seeds 0 and 1 stood at 32% and 95% mean token accuracy,
# after 400 both at 98.9%), so each round is 400 steps and a round that ends short of the check is followed by
# another, up to 3. chain: 40 passes over 200 problems from a teacher that errs in 30% of steps (its graded
# answers have many right token sequences: no exact check).
SFT_PRESETS = {
    "running": SFTSettings(
        n_examples=12800,
        epochs=1,
        noise=0.01,
        warmup_ratio=0.1,
        band=(0.55, 1.25),
        min_position_accuracy=0.97,
        max_rounds=3,
    ),
    "chain": SFTSettings(),
}

# Problems of the warm start's check: a draw of the train split of their own (never the held-out test split,
# which would then have chosen the model that is evaluated on it).
VALIDATION_PROBLEMS = 256


def default_cache_dir() -> Path:
    """``$KPO_CACHE`` or ``~/.cache/kpo``."""
    return Path(os.environ.get("KPO_CACHE", Path.home() / ".cache" / "kpo"))


def _cache_key(shape: TinyModelConfig, task: TaskConfig, sft: SFTSettings, seed: int) -> str:
    import torch
    import transformers
    import trl

    blob = json.dumps(
        {
            "shape": asdict(shape),
            "task": asdict(task),
            "sft": asdict(sft),
            "seed": seed,
            "alphabet": ALPHABET,
            "versions": [torch.__version__, transformers.__version__, trl.__version__],
            "format": 4,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sft_problems(task: TaskConfig, n: int, seed: int, round_: int = 0) -> list[dict]:
    """The warm start's ``n`` training problems of SFT round ``round_`` (:func:`kpo.testbed.task.load_split`
    rows); ValueError when the task's train split cannot supply them."""
    # Seed offsets keep warm-start problems a different draw from the RL prompts of the same seed, and each
    # round a different draw from the others.
    return load_split("train", n=n, seed=seed + 10_000 + 100_000 * round_, task=task)


def validation_problems(task: TaskConfig, seed: int) -> list[dict]:
    """The :data:`VALIDATION_PROBLEMS` problems the warm start of ``seed`` is checked on (train split, a draw
    of their own)."""
    return load_split("train", n=VALIDATION_PROBLEMS, seed=seed + 20_000, task=task)


def check_warm_start(model, tokenizer, task: TaskConfig, sft: SFTSettings, seed: int) -> dict | None:
    """The warm start's check (None when ``sft.band`` is None): ``expected_accuracy`` and
    ``min_position_accuracy`` (and its ``worst_position``, 0 = the first response token) on the validation
    problems, and ``ok``: both within the settings' band and floor."""
    if sft.band is None:
        return None
    from kpo.evaluation.expected import expected_on_rows

    stats = expected_on_rows(model, tokenizer, validation_problems(task, seed))
    low, high = accuracy_band(task, sft)
    floor = sft.min_position_accuracy if sft.min_position_accuracy is not None else 0.0
    position = stats["position_accuracy"]
    return {
        "expected_accuracy": stats["mean"],
        "band": [low, high],
        "min_position_accuracy": stats["min_position_accuracy"],
        "worst_position": position.index(min(position)),
        "ok": low <= stats["mean"] <= high and stats["min_position_accuracy"] >= floor,
    }


def accuracy_band(task: TaskConfig, sft: SFTSettings) -> tuple[float, float]:
    """The expected accuracies (fractions) the warm start must lie between: ``sft.band`` times the teacher's
    exact accuracy ``(1 - noise) ** n_terms`` (capped at 1)."""
    teacher = (1.0 - sft.noise) ** task.n_terms
    return sft.band[0] * teacher, min(1.0, sft.band[1] * teacher)


def _check_text(check: dict, sft: SFTSettings) -> str:
    low, high = check["band"]
    return (
        f"expected accuracy {100 * check['expected_accuracy']:.1f}% (band {100 * low:.1f}-{100 * high:.1f}%), "
        f"least position accuracy {check['min_position_accuracy']:.4f} at response token "
        f"{check['worst_position']} (floor {sft.min_position_accuracy})"
    )


def _sft_records(task: TaskConfig, sft: SFTSettings, seed: int, round_: int) -> list[dict]:
    """SFT round ``round_``'s prompt/completion pairs: its problems, ``sft.epochs`` times, each pass with fresh
    teacher noise."""
    rows = sft_problems(task, sft.n_examples, seed, round_)
    rng = random.Random(f"kpo-sft-noise/{seed}" + (f"/{round_}" if round_ else ""))
    return [
        {
            "prompt": r["prompt"],
            "completion": noisy_solve(task.terms(r["problem"]), rng, sft.noise, task.kind),
        }
        for _ in range(sft.epochs)
        for r in rows
    ]


def _check_fits(records: list[dict], tokenizer, max_length: int) -> None:
    """ValueError naming the first warm-start example longer than the model's context (SFTTrainer would cut
    it, losing its answer and end token)."""
    for i, r in enumerate(records):
        length = len(tokenizer(r["prompt"] + r["completion"])["input_ids"]) + 1  # + eos
        if length > max_length:
            raise ValueError(
                f"warm-start example {i} ({r['prompt'][:40]!r}...) is {length} tokens with its end token, longer "
                f"than the model's context of {max_length}: build the model with max_position_embeddings >= "
                f"{length} (kpo.testbed.tiny.context_length(task) sizes it from the task)"
            )


def warm_start(
    task: TaskConfig | None = None,
    shape: TinyModelConfig | None = None,
    sft: SFTSettings | None = None,
    *,
    seed: int = 0,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> Path:
    """Path of the SFT warm-started tiny model (model + tokenizer, ``from_pretrained``-ready).

    Trains it with TRL's SFTTrainer on the train split's reference solutions (loss on the completion only)
    the first time, then reuses the cached copy.
    """
    task, shape, sft = task or TaskConfig(), shape or TinyModelConfig(), sft or SFTSettings()
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache_dir / f"tiny-sft-{_cache_key(shape, task, sft, seed)}"
    if (out / "config.json").exists() and (out / "kpo_sft.json").exists():
        return out

    import sys

    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from kpo.train.progress import checkpointing_arg, library_bars, use_quiet_progress

    library_bars(progress)  # before SFTTrainer's dataset preparation bars

    if progress:
        print(f"kpo: warm start (supervised, cached afterwards) -> {out}", file=sys.stderr)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, shape, seed=seed)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    args = SFTConfig(
        output_dir=str(tmp),
        num_train_epochs=1,  # the epochs are in the dataset, each with its own noise
        per_device_train_batch_size=sft.batch_size,
        learning_rate=sft.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=sft.warmup_ratio,  # a float < 1 is a share of the steps
        weight_decay=0.0,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        max_length=shape.max_position_embeddings,
        # TRL's default recomputes every forward: a third more work, and the tiny model needs no memory saved
        **checkpointing_arg(False),
        completion_only_loss=True,
        disable_tqdm=not progress,
        dataloader_num_workers=0,
    )
    losses, checks = [], []
    for round_ in range(sft.max_rounds):
        records = _sft_records(task, sft, seed, round_)
        _check_fits(records, tokenizer, shape.max_position_embeddings)
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=Dataset.from_list(records), processing_class=tokenizer
        )
        use_quiet_progress(trainer, progress)
        losses.append(trainer.train().training_loss)
        model = trainer.model
        check = check_warm_start(model.eval(), tokenizer, task, sft, seed)
        model.train()
        if check is None:
            break
        checks.append(check)
        if progress:
            print(f"kpo: warm start round {round_ + 1}: {_check_text(check, sft)}", file=sys.stderr)
        if check["ok"]:
            break
    if checks and not checks[-1]["ok"]:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(
            f"the warm start of seed {seed} failed its check after {sft.max_rounds} SFT rounds: "
            f"{_check_text(checks[-1], sft)}. Nothing was cached. Raise --sft-examples (steps per round) or "
            "--sft-learning-rate, or lower --sft-noise for a higher expected accuracy"
        )
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "kpo_sft.json").write_text(
        json.dumps(
            {
                "task": asdict(task),
                "shape": asdict(shape),
                "sft": asdict(sft),
                "seed": seed,
                "rounds": len(losses),
                "train_loss": losses[-1],
                "train_losses": losses,
                "checks": checks,
            },
            indent=2,
        )
    )
    # Atomic publish: a concurrent run either sees the finished directory or builds its own.
    try:
        tmp.rename(out)
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out
