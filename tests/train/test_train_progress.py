"""Console output of the trainers (kpo.train.progress): a bar on a terminal, one line per 5% of the steps in a
log, nothing with progress off (the libraries' bars included), and none of TRL's deprecation warnings."""

from __future__ import annotations

import io
import re
import warnings

import pytest

datasets = pytest.importorskip(
    "datasets", reason="kpo train needs the train extra (pip install 'kpo[train]')"
)
from huggingface_hub.utils import are_progress_bars_disabled  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.trainer_callback import (  # noqa: E402
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerControl,
    TrainerState,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from kpo.testbed.tiny import TinyModelConfig, build_model, build_tokenizer  # noqa: E402
from kpo.train.progress import checkpointing_arg, use_quiet_progress  # noqa: E402


class FakeTrainer:
    """The callback surface of a transformers Trainer, as a trainer starts out (printer + progress bar)."""

    def __init__(self):
        self.handler = CallbackHandler([DefaultFlowCallback, PrinterCallback, ProgressCallback], *[None] * 4)

    def add_callback(self, callback):
        self.handler.add_callback(callback)

    def remove_callback(self, callback):
        self.handler.remove_callback(callback)

    def added(self) -> list:
        return [cb for cb in self.handler.callbacks if not isinstance(cb, DefaultFlowCallback)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def library_bars_restored():
    """use_quiet_progress switches the libraries' bars process-wide: put them back for the other tests."""
    before = (hf_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled())
    yield
    hf_logging.enable_progress_bar() if before[0] else hf_logging.disable_progress_bar()
    datasets.enable_progress_bars() if before[1] else datasets.disable_progress_bars()


def _bars_on() -> tuple[bool, bool, bool]:
    return (
        hf_logging.is_progress_bar_enabled(),
        not are_progress_bars_disabled(),
        datasets.is_progress_bar_enabled(),
    )


def test_progress_false_silences_every_bar_and_the_trainer(tmp_path, capfd):
    hf_logging.enable_progress_bar()
    datasets.enable_progress_bars()
    trainer = FakeTrainer()
    use_quiet_progress(trainer, False)
    assert trainer.added() == [] and _bars_on() == (False, False, False)
    model = build_model(build_tokenizer(), TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2))
    model.save_pretrained(tmp_path)  # "Writing model shards"
    AutoModelForCausalLM.from_pretrained(tmp_path)  # "Loading weights"
    datasets.Dataset.from_list([{"x": i} for i in range(8)]).map(lambda row: row, desc="kpo map")
    err = capfd.readouterr().err
    assert not re.search(r"Writing model shards|Loading weights|kpo map|it/s", err), err


def test_a_terminal_gets_one_quiet_bar_and_keeps_the_library_bars():
    hf_logging.enable_progress_bar()
    datasets.enable_progress_bars()
    trainer = FakeTrainer()
    use_quiet_progress(trainer, True, stream=Terminal())
    (bar,) = trainer.added()
    assert isinstance(bar, ProgressCallback) and _bars_on() == (True, True, True)


def _drive(callback, max_steps: int, first_step: int = 0) -> None:
    args, control = None, TrainerControl()
    state = TrainerState(max_steps=max_steps, global_step=first_step)
    callback.on_train_begin(args, state, control)
    for step in range(first_step + 1, max_steps + 1):
        state.global_step = step
        callback.on_log(args, state, control, logs={"reward": step / max_steps, "loss": 0.25, "lr": 1e-6})
    callback.on_train_end(args, state, control)


@pytest.mark.parametrize(
    "max_steps,first_step,printed",
    [
        (100, 0, [1, *range(5, 101, 5)]),
        (7, 0, list(range(1, 8))),  # fewer steps than lines: every step
        (100, 42, [43, *range(45, 101, 5)]),  # a resumed run counts from where it starts
    ],
)
def test_a_log_gets_a_line_every_5_percent_of_the_steps(max_steps, first_step, printed):
    stream = io.StringIO()
    trainer = FakeTrainer()
    use_quiet_progress(trainer, True, stream=stream)
    (line_progress,) = trainer.added()
    assert not isinstance(line_progress, ProgressCallback) and _bars_on() == (False, False, False)
    _drive(line_progress, max_steps, first_step)
    out = stream.getvalue()
    assert "\r" not in out
    lines = out.splitlines()
    assert [int(re.match(r"FakeTrainer step (\d+)/", line).group(1)) for line in lines] == printed, out
    assert re.fullmatch(
        rf"FakeTrainer step {printed[0]}/{max_steps} \(\d+%\)  reward \d\.\d{{3}}  loss 0\.250  "
        r"\d+:\d\d elapsed, ~\d+:\d\d left",
        lines[0],
    ), lines[0]
    assert re.fullmatch(
        rf"FakeTrainer step {max_steps}/{max_steps} \(100%\)  reward 1\.000  loss 0\.250  "
        r"\d+:\d\d elapsed",
        lines[-1],
    ), lines[-1]


def test_exactly_trls_deprecation_warnings_are_ignored():
    model = build_model(build_tokenizer(), TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use_quiet_progress(FakeTrainer(), False)
        if model.is_gradient_checkpointing:  # what trl.models.utils calls around generation
            raise AssertionError("the tiny model starts without checkpointing")
        model.gradient_checkpointing_enable()
        model.gradient_checkpointing_disable()
        # the same words from another module still show: the filter is transformers.modeling_utils' only
        warnings.warn(
            "`gradient_checkpointing_enable` is deprecated (not transformers')", FutureWarning, stacklevel=1
        )
    assert [str(w.message) for w in caught] == [
        "`gradient_checkpointing_enable` is deprecated (not transformers')"
    ]


def test_checkpointing_arg_sets_checkpointing_without_a_deprecation_warning(tmp_path):
    from trl import GRPOConfig

    for enabled in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **checkpointing_arg(enabled))
        assert args.gradient_checkpointing is enabled
