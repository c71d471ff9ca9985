"""kpo as a verl 0.9.1 plugin: names arrive through the entry point, verl's call equals kpo.policy_loss exactly,
the adapter reads global batch info and IS weights as verl's own losses do, and the actor config subclass goes
through verl's hydra instantiation. Needs verl (`make test` runs it in .venv-verl); skips without it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="verl not installed: `make test` runs this file in .venv-verl")

import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.errors import InstantiationException  # noqa: E402
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402
from verl.workers.config import FSDPActorConfig, PolicyLossConfig  # noqa: E402

from kpo.integrations.verl import (  # noqa: E402
    VERL_EQUIVALENTS,
    VERL_LOSSES,
    VERL_OWNED,
    KPOActorConfig,
    register_with_verl,
    trl_has_value_head_model,
    verl_policy_loss,
)
from kpo.integrations.verl_fields import PLUGIN_FIELDS  # noqa: E402
from kpo.losses import get_loss_spec, list_losses, policy_loss  # noqa: E402

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")
VERL_BUILTINS = (
    "vanilla",
    "dppo_tv",
    "dppo_kl",
    "gspo",
    "sapo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "cispo",
    "bypass_mode",
)

# Per registered loss: KPOActorConfig fields, and the kpo.policy_loss keywords they must become. verl's own
# actor fields (clip_ratio 0.2, clip_ratio_low 0.2, clip_ratio_high 0.2, clip_ratio_c 3.0 by default) are
# passed to every loss that accepts them.
CLIP = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
CASES = {
    "kpo": (
        {"q": 1e-3, "v": 2.0, "mask_mode": "advance"},
        {**CLIP, "q": 1e-3, "v": 2.0, "mask_mode": "advance"},
    ),
    "kpo_unclipped": ({"q": 1e-2, "x0": 0.01}, {"q": 1e-2, "x0": 0.01}),
    "aspo": ({"entropy_quantile": 0.5}, {**CLIP, "clip_ratio_c": 3.0, "entropy_quantile": 0.5}),
    "ctpo": ({"la_clip_high": 0.1, "ratio_mode": "geomean"}, {"la_clip_high": 0.1, "ratio_mode": "geomean"}),
    "holder": ({"holder_p": 0.5}, {**CLIP, "p": 0.5}),
    "vespo": ({"k_pos": 1.5}, {"k_pos": 1.5}),
    "luspo": (
        {"delta": 1.2, "off_policy_mask_threshold": 0.01},
        {**CLIP, "delta": 1.2, "off_policy_mask_threshold": 0.01},
    ),
    "minpro": ({}, CLIP),
    "cppo": (
        {"cppo_delta": 0.1, "cppo_w_min": 0.6, "cppo_budget_quantile": 0.9},
        {"cppo_delta": 0.1, "cppo_w_min": 0.6, "cppo_budget_quantile": 0.9},
    ),
}


def actor_config(loss_mode: str, loss_agg_mode: str = "token-mean", **fields) -> KPOActorConfig:
    return KPOActorConfig(
        rollout_n=8,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        loss_agg_mode=loss_agg_mode,
        **fields,
    )


def make_batch(seed: int = 0, B: int = 6, T: int = 9, empty_row: bool = True):
    """Right-padded rows of lengths 9, 7, 5, 3, 1 (and an all-padding row), a hole inside row 1, per-row
    advantages broadcast over tokens as verl passes them, and IS weights in [0.5, 2]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 7, 5, 3, 1, 0 if empty_row else 4])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask[1, 3] = False
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 1.5  # new stays a log-probability, <= 0
    new = (old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    weights = 0.5 + 1.5 * torch.rand(B, T, generator=g, dtype=torch.float64)
    return new, old, adv, mask, weights


def verl_call(fn, new, old, adv, mask, mode, config, weights):
    """The keywords verl 0.9.1's ppo_loss (verl/workers/utils/losses.py) passes."""
    return fn(
        old_log_prob=old,
        log_prob=new,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=weights,
    )


def test_entry_point_registers_in_a_clean_interpreter():
    # Only `import verl`: the names can arrive through the verl.plugins entry point and nothing else.
    code = (
        "import json, verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R\n"
        "print(json.dumps({k: f.__module__ for k, f in R.items()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    for name in VERL_LOSSES:
        assert modules.get(name) == "kpo.integrations.verl", f"{name} not registered by kpo: {modules}"
    for name in VERL_BUILTINS:
        assert modules[name] == "verl.trainer.ppo.core_algos", f"verl's {name!r} was replaced"


def test_verl_model_patching_tolerates_trl_1():
    # verl's apply_monkey_patch imports trl's value-head model whenever "trl is available"; the plugin narrows
    # that check to "trl still has the class". trl 1.x (kpo's train extra; installed beside verl here) has none,
    # so verl skips the step instead of failing every model build (test_verl_e2e trains through it).
    from importlib.metadata import version

    from verl.models.transformers import monkey_patch

    assert monkey_patch.is_trl_available is trl_has_value_head_model
    if int(version("trl").split(".")[0]) >= 1:
        assert not monkey_patch.is_trl_available()


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert eps.get("kpo") == "kpo.integrations.verl"


def test_every_kpo_loss_is_registered_or_has_a_verl_equivalent():
    assert set(VERL_LOSSES).isdisjoint(VERL_BUILTINS)
    assert set(VERL_LOSSES) | set(VERL_EQUIVALENTS) == set(list_losses())
    assert set(VERL_EQUIVALENTS.values()) <= set(VERL_BUILTINS)
    for name in VERL_LOSSES:
        assert POLICY_LOSS_REGISTRY[name].kpo_loss == name


def test_registration_never_overwrites_and_is_idempotent(monkeypatch):
    # Registering again is a no-op for kpo's own functions.
    assert register_with_verl() == ()

    # A name that verl (say a future release) already has stays verl's, with a warning.
    def verls_vespo(**kwargs):
        raise AssertionError("not called")

    monkeypatch.setitem(POLICY_LOSS_REGISTRY, "vespo", verls_vespo)
    with pytest.warns(UserWarning, match="verl already registers a policy loss 'vespo'"):
        assert register_with_verl(("vespo",)) == ()
    assert POLICY_LOSS_REGISTRY["vespo"] is verls_vespo


@pytest.mark.parametrize("name", VERL_LOSSES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_verl_call_is_exactly_kpo_policy_loss(name, mode):
    fields, hparams = CASES[name]
    assert set(get_loss_spec(name).hparams) >= set(hparams)
    config = actor_config(name, mode, **fields)
    # What verl's ppo_loss writes before the call: dp_size 2, global counts of a bigger mini-batch.
    config.global_batch_info.update(
        dp_size=2, batch_num_tokens=50, global_batch_size=12, loss_scale_factor=None
    )
    new, old, adv, mask, weights = make_batch()
    loss, metrics = verl_call(get_policy_loss_fn(name), new, old, adv, mask, mode, config, weights)
    (grad,) = torch.autograd.grad(loss, new)

    expected, expected_metrics = policy_loss(
        name,
        log_prob=new,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=None if name in ("holder", "luspo") else mode,  # their methods fix the aggregation
        rollout_is_weights=weights,
        dp_size=2,
        global_num_tokens=50,
        global_num_seqs=12,
        **hparams,
    )
    (expected_grad,) = torch.autograd.grad(expected, new)
    assert torch.equal(loss, expected)
    assert torch.equal(grad, expected_grad)
    assert grad.abs().sum() > 0
    assert metrics == {f"actor/{k}": v for k, v in expected_metrics.items() if k != "pg_loss"}
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"} <= set(metrics)


# kpo loss -> verl 0.9.1's own loss with the same formula: the adapter must feed global_batch_info and
# rollout_is_weights into kpo exactly where verl's implementation uses them.
@pytest.mark.parametrize(
    "kpo_name, verl_name, modes",
    [
        ("vanilla", "vanilla", MODES),
        ("gspo_token", "gspo", MODES),
        ("cispo", "cispo", MODES),
        ("sapo", "sapo", ("seq-mean-token-mean",)),
    ],
)
@pytest.mark.parametrize("dp_size", [1, 2])
def test_adapter_matches_verl_own_losses(kpo_name, verl_name, modes, dp_size):
    new, old, adv, mask, weights = make_batch(seed=1)
    for mode in modes:
        config = actor_config(verl_name, mode, clip_ratio_low=0.1, clip_ratio_high=0.15, loss_scale_factor=16)
        config.global_batch_info.update(
            dp_size=dp_size, batch_num_tokens=40, global_batch_size=10, loss_scale_factor=16
        )
        ours, our_metrics = verl_call(verl_policy_loss(kpo_name), new, old, adv, mask, mode, config, weights)
        theirs, their_metrics = verl_call(
            POLICY_LOSS_REGISTRY[verl_name], new, old, adv, mask.float(), mode, config, weights
        )
        (g_ours,) = torch.autograd.grad(ours, new)
        (g_theirs,) = torch.autograd.grad(theirs, new)
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-14, msg=f"{kpo_name} {mode}")
        torch.testing.assert_close(g_ours, g_theirs, rtol=1e-10, atol=1e-14, msg=f"{kpo_name} {mode}")
        for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert our_metrics[key] == pytest.approx(their_metrics[key], rel=1e-12, abs=1e-15), key


def test_adapter_matches_verl_geo_mean():
    # verl's geo_mean ignores global_batch_info (plain torch.mean over rows) and counts empty rows, so the
    # comparison uses one micro-batch = the whole batch without empty rows; IS weights enter as the row's
    # geometric mean in both.
    new, old, adv, mask, weights = make_batch(seed=2, empty_row=False)
    config = actor_config("geo_mean", clip_ratio_low=0.1, clip_ratio_high=0.15)
    ours, _ = verl_call(verl_policy_loss("gmpo"), new, old, adv, mask, "token-mean", config, weights)
    theirs, _ = verl_call(
        POLICY_LOSS_REGISTRY["geo_mean"], new, old, adv, mask.float(), "token-mean", config, weights
    )
    (g_ours,) = torch.autograd.grad(ours, new)
    (g_theirs,) = torch.autograd.grad(theirs, new)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-8, atol=1e-14)


@pytest.mark.parametrize("name", ["kpo", "holder", "vespo"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dp_size", [1, 2])
def test_global_batch_info_makes_split_batch_equal_unsplit(name, mode, dp_size):
    """Micro-batches 0-2 and 3-5 (or two dp ranks holding them): sum (mean over ranks) of their losses and
    gradients = the unsplit batch's, as in verl's gradient accumulation and data-parallel averaging."""
    new, old, adv, mask, weights = make_batch(seed=3)
    fields = CASES[name][0]
    fn = get_policy_loss_fn(name)
    n_tok, n_seq = int(mask.sum()), int(mask.any(dim=-1).sum())  # verl's counts: valid tokens, non-empty rows

    whole_cfg = actor_config(name, mode, **fields)
    whole, _ = verl_call(fn, new, old, adv, mask, mode, whole_cfg, weights)
    (g_whole,) = torch.autograd.grad(whole, new)

    total = 0.0
    for rows in (slice(0, 3), slice(3, 6)):
        cfg = actor_config(name, mode, **fields)
        cfg.global_batch_info.update(dp_size=dp_size, batch_num_tokens=n_tok, global_batch_size=n_seq)
        part, _ = verl_call(fn, new[rows], old[rows], adv[rows], mask[rows], mode, cfg, weights[rows])
        total = total + part / dp_size
    (g_split,) = torch.autograd.grad(total, new)
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g_split, g_whole, rtol=1e-12, atol=1e-15)
    assert g_whole.abs().sum() > 0


def test_config_rejects_bad_or_unused_settings():
    bad_q = r"actor_rollout_ref\.actor \(loss_mode='kpo'\).*q \(process noise\) must be > 0"
    with pytest.raises(ValueError, match=bad_q):
        actor_config("kpo", q=-1.0)
    with pytest.raises(ValueError, match="does not use holder_p"):
        actor_config("kpo", holder_p=2.0)
    with pytest.raises(ValueError, match="verl's own loss"):
        actor_config("vanilla", q=1e-6)
    # No kpo field set: verl's own losses and kpo's defaults are fine.
    assert actor_config("vanilla").q is None
    assert actor_config("kpo_unclipped").q is None


def test_ratio_dumps_count_each_rank_s_optimizer_steps(tmp_path, monkeypatch):
    # verl's loss call does not say which optimizer step it is in: a rank's micro-batches of one mini-batch hold
    # global_batch_size / dp_size rows together. 4 steps of 2 micro-batches (3 + 1 rows), a dump every 2 steps:
    # steps 2 and 4, each the step's 4 rows (padded to the widest), read back by kpo analyze's reader.
    import kpo.integrations.verl as plugin
    from kpo.analysis.dumps import load_dump
    from kpo.filter import kalman_filter

    monkeypatch.setattr(plugin, "_DUMPS", plugin.RatioDumps())
    monkeypatch.setattr(plugin, "_STEPS", plugin._OptimizerSteps())
    config = actor_config("kpo", dump_ratios_every=2, dump_ratios_dir=str(tmp_path), memory=4.0)
    config.global_batch_info.update(dp_size=2, batch_num_tokens=40, global_batch_size=8, loss_scale_factor=None)
    new, old, adv, mask, _ = make_batch(B=4, empty_row=False)
    fn = get_policy_loss_fn("kpo")
    micro_batches = ((slice(0, 3), 9), (slice(3, 4), 4))  # v1 pads each to its own longest response
    for _ in range(4):
        for rows, width in micro_batches:
            part = (new[rows, :width], old[rows, :width], adv[rows, :width], mask[rows, :width])
            verl_call(fn, *part, "token-mean", config, None)
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps == ["step_000002-rank0.safetensors", "step_000004-rank0.safetensors"]
    dump = load_dump(tmp_path / "step_000004-rank0.safetensors")
    z = (new - old).detach().double() * mask
    assert dump.meta["step"] == "4" and dump.meta["loss"] == "kpo" and dump.mask.tolist() == mask.tolist()
    torch.testing.assert_close(torch.as_tensor(dump.log_ratio), z, atol=1e-6, rtol=0)
    settings = {k: dump.meta_float(k) for k in ("q", "v", "p0", "x0")}
    filtered = kalman_filter(z, mask, **settings, mask_mode=dump.meta["mask_mode"])
    torch.testing.assert_close(torch.as_tensor(dump.filtered), filtered, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="is verl's own loss"):
        actor_config("vanilla", dump_ratios_every=2, dump_ratios_dir=str(tmp_path))
    with pytest.raises(ValueError, match="dump_ratios_every to an integer >= 1"):
        actor_config("kpo", dump_ratios_every=0, dump_ratios_dir=str(tmp_path))


def _compose(*overrides: str, micro_batch: bool = True):
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    base = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"] if micro_batch else []
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=[*base, *overrides])


def test_config_subclass_through_verl_hydra_instantiation():
    kpo_keys = ["+actor_rollout_ref.actor.q=1e-6", "+actor_rollout_ref.actor.v=1.0"]
    cfg = _compose(
        "actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=kpo",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.clip_ratio_low=3e-4",
        "actor_rollout_ref.actor.clip_ratio_high=4e-4",
        *kpo_keys,
    )
    # verl's own path (validate_config and the actor worker both call it).
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor) is KPOActorConfig
    assert (actor.q, actor.v, actor.p0, actor.clip_ratio_low, actor.clip_ratio_high) == (
        1e-6,
        1.0,
        None,
        3e-4,
        4e-4,
    )
    assert actor.policy_loss.loss_mode == "kpo"

    new, old, adv, mask, weights = make_batch(seed=4)
    loss, _ = verl_call(get_policy_loss_fn("kpo"), new, old, adv, mask, actor.loss_agg_mode, actor, None)
    expected, _ = policy_loss(
        "kpo",
        log_prob=new,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        clip_ratio=0.2,
        clip_ratio_low=3e-4,
        clip_ratio_high=4e-4,
        q=1e-6,
        v=1.0,
    )
    assert torch.equal(loss, expected)

    # Without the subclass verl's own FSDPActorConfig refuses the extra keys: why KPOActorConfig exists.
    with pytest.raises(InstantiationException, match="'q'"):
        omega_conf_to_dataclass(_compose(*kpo_keys).actor_rollout_ref.actor)


def test_the_actor_config_s_loss_fields_are_the_registry_s_keywords():
    # One source of truth: every keyword of every loss the plugin registers is a field (or one of verl's own
    # clip fields), typed from the loss's annotation; nothing else besides the ratio dumps and the steps of a batch.
    verl_own = {f.name for f in dataclasses.fields(FSDPActorConfig)}
    ours = {f.name: f for f in dataclasses.fields(KPOActorConfig) if f.name not in verl_own}
    expected = set(PLUGIN_FIELDS)
    for name in VERL_LOSSES:
        for hparam in get_loss_spec(name).hparams:
            if hparam in VERL_OWNED:
                assert hparam in verl_own
            elif hparam not in ("token_entropy", "top_entropy_quantile"):  # verl's loss call has no entropy
                expected.add("holder_p" if hparam == "p" else hparam)
    assert set(ours) == expected
    assert all(f.default is None for f in ours.values())
    assert (ours["q"].type, ours["mask_mode"].type, ours["filter_grad"].type) == (float | None, str | None, bool | None)
    assert ours["memory"].type is Any  # float | str | None: OmegaConf types no such union


_NEW_KEYWORD = """
import json, os, sys
from kpo.losses import registry
from kpo.losses._core import LossTerms

# A keyword added to a registered loss (what an edit of kpo/losses/reinforce.py would do), before the plugin
# is imported: the plugin module is not touched.
minpro = registry._REGISTRY.pop("minpro")


@registry.register_loss("minpro", default_agg=minpro.default_agg, agg_modes=minpro.agg_modes)
def minpro_scaled(batch, *, clip_ratio=None, clip_ratio_low=None, clip_ratio_high=None, minpro_scale: float = 1.0):
    terms = minpro.fn(batch, clip_ratio=clip_ratio, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    return LossTerms(token_loss=terms.token_loss * minpro_scale, clipfrac=terms.clipfrac, extra=terms.extra)


import torch
import verl
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import PolicyLossConfig

from kpo.integrations.verl import KPOActorConfig
from kpo.losses import policy_loss

with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                           version_base=None):
    cfg = compose("ppo_trainer", overrides=[
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=minpro",
        "+actor_rollout_ref.actor.minpro_scale=2.5",
    ])
actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
g = torch.Generator().manual_seed(0)
old = -torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5
new = old + 0.1 * torch.randn(3, 5, generator=g, dtype=torch.float64)
adv, mask = torch.tensor([[1.0], [-0.5], [0.25]], dtype=torch.float64).expand(3, 5), torch.ones(3, 5, dtype=torch.bool)
loss, _ = get_policy_loss_fn("minpro")(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                       loss_agg_mode=actor.loss_agg_mode, config=actor)
batch = dict(log_prob=new, old_log_prob=old, advantages=adv, response_mask=mask)
scaled, _ = policy_loss("minpro", **batch, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, minpro_scale=2.5)
plain, _ = policy_loss("minpro", **batch, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2)
try:
    KPOActorConfig(rollout_n=8, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(loss_mode="cppo"),
                   minpro_scale=2.0)
    refused = ""
except ValueError as err:
    refused = str(err)
print(json.dumps({"type": str(KPOActorConfig.__dataclass_fields__["minpro_scale"].type),
                  "value": actor.minpro_scale, "equal": bool(torch.equal(loss, scaled)),
                  "ratio": (loss / plain).item(), "refused": refused}))
"""


def test_a_keyword_added_to_a_loss_reaches_the_actor_config_with_no_plugin_edit():
    out = subprocess.run([sys.executable, "-c", _NEW_KEYWORD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["type"] == "float | None" and got["value"] == 2.5
    assert got["equal"] and got["ratio"] == pytest.approx(2.5)  # verl's call passed the new keyword to the loss
    assert "does not use minpro_scale" in got["refused"]  # and the config's checks know it


def test_memory_auto_through_verl_hydra_fits_q_and_reports_it(monkeypatch):
    """+actor_rollout_ref.actor.memory=auto (a string where memory is otherwise a number): verl's config path
    keeps it, the loss filters at the step's q (the paper's before any step is fitted) and reports it as
    actor/kpo/q and actor/kpo/memory_tokens."""
    import kpo.integrations.verl as plugin

    monkeypatch.setattr(plugin, "_STEPS", plugin._OptimizerSteps())
    monkeypatch.setattr(plugin, "_FITS", {})
    cfg = _compose(
        "actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=kpo",
        "+actor_rollout_ref.actor.memory=auto",
        "+actor_rollout_ref.actor.q_max=0.5",
        "+actor_rollout_ref.actor.steps_per_batch=2",
    )
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert (actor.memory, actor.q_max) == ("auto", 0.5)
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=6, loss_scale_factor=None)
    new, old, adv, mask, _ = make_batch(seed=5)
    loss, metrics = verl_call(get_policy_loss_fn("kpo"), new, old, adv, mask, actor.loss_agg_mode, actor, None)
    expected, _ = policy_loss(
        "kpo",
        log_prob=new,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode,
        clip_ratio=0.2,
        q=1e-6,
        global_num_seqs=6,
        dp_size=1,
    )
    assert torch.equal(loss, expected) and metrics["actor/kpo/q"] == 1e-6 and "actor/kpo/memory_tokens" in metrics
    with pytest.raises(ValueError, match="give a number of tokens > 0 or 'auto'"):
        actor_config("kpo", memory="fitted")


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"


@pytest.mark.parametrize(
    "script, env, loss, q, nnodes",
    [
        ("run_kpo_qwen3_4b.sh", {}, "kpo", 1e-6, 1),
        ("run_kpo_qwen3_4b.sh", {"LOSS": "kpo_unclipped"}, "kpo_unclipped", 1e-4, 1),
        ("run_kpo_qwen3_4b_multinode.sh", {"NNODES": "4"}, "kpo", 1e-6, 4),
    ],
)
def test_launch_scripts_pass_verl_config_validation(script, env, loss, q, nnodes):
    """The launch scripts' overrides, composed with verl's ppo_trainer config and checked by the same
    validate_config that verl's main_ppo runs before starting Ray."""
    args = ["train"] if "multinode" in script else []
    out = subprocess.run(
        ["bash", str(EXAMPLES / script), *args],
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    cfg = _compose(*out.stdout.splitlines(), micro_batch=False)
    # What verl.trainer.ppo.utils.need_reference_policy/need_critic derive (importing them needs `datasets`):
    # no KL loss or KL reward -> no reference model; GRPO advantages -> no critic.
    assert not cfg.actor_rollout_ref.actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward
    assert cfg.algorithm.adv_estimator == "grpo"
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor) is KPOActorConfig
    assert (actor.policy_loss.loss_mode, actor.q, actor.v, actor.loss_agg_mode) == (
        loss,
        q,
        1.0,
        "seq-mean-token-mean",
    )
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.optim.lr) == (3e-4, 4e-4, 1e-6)
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, cfg.actor_rollout_ref.rollout.n) == (
        32,
        8,
        8,
    )
    assert cfg.data.max_response_length == 4096 and cfg.actor_rollout_ref.rollout.val_kwargs.n == 16
    assert cfg.trainer.use_v1  # the trainer test_verl_e2e.py runs
    assert len(cfg.data.val_files) == 6 and cfg.trainer.nnodes == nnodes
    assert Path(cfg.reward.custom_reward_function.path).is_file()


def test_verl_actor_loss_function_calls_kpo():
    """verl's own actor loss (verl/workers/utils/losses.py ppo_loss, what the FSDP and Megatron workers run):
    it fills config.global_batch_info from the micro-batch, calls the registered kpo loss and records its
    metrics; the result is kpo.policy_loss's exactly."""
    losses = pytest.importorskip(
        "verl.workers.utils.losses", reason="verl's actor loss module needs datasets, pillow"
    )
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    new, old, adv, mask, weights = make_batch(seed=5, empty_row=False)
    B, T = mask.shape
    P = 2  # prompt tokens per row
    lengths = torch.tensor([int(row.nonzero().max()) + 1 for row in mask])  # response lengths (holes inside)
    # The model's flat output over prompt + response tokens; verl reads the response's log-probs shifted by one.
    flat = torch.cat(
        [torch.cat([new.new_zeros(P - 1), new[i, : lengths[i]], new.new_zeros(1)]) for i in range(B)]
    )
    data = TensorDict(
        {
            "prompts": torch.ones(B, P, dtype=torch.long),
            "responses": torch.ones(B, T, dtype=torch.long),
            "attention_mask": torch.cat(
                [torch.ones(B, P), (torch.arange(T) < lengths[:, None]).float()], 1
            ).long(),
            "response_mask": mask.long(),
            "old_log_probs": old,
            "advantages": adv,
            "rollout_is_weights": weights,
        },
        batch_size=[B],
    )
    tu.assign_non_tensor(data, dp_size=2, batch_num_tokens=50, global_batch_size=12)
    config = actor_config("kpo", "seq-mean-token-mean", q=1e-3)

    loss, metrics = losses.ppo_loss(config, {"log_probs": flat}, data)
    (grad,) = torch.autograd.grad(loss, new)
    expected, expected_metrics = policy_loss(
        "kpo",
        log_prob=new,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="seq-mean-token-mean",
        rollout_is_weights=weights,
        dp_size=2,
        global_num_tokens=50,
        global_num_seqs=12,
        **CLIP,
        q=1e-3,
    )
    (expected_grad,) = torch.autograd.grad(expected, new)
    assert torch.equal(loss, expected)
    assert torch.equal(grad, expected_grad)
    assert metrics["actor/pg_loss"].values == [expected.item()]
    for key in ("ppo_kl", "pg_clipfrac", "filtered_ratio_mean"):
        assert metrics[f"actor/{key}"].values == [expected_metrics[key]]


def test_kpo_with_verls_ppo_clip_defaults_warns():
    # verl's actor config defaults the clip ratios to 0.2: KPO run that way is barely ever clipped
    with pytest.warns(UserWarning, match="the paper's KPO uses 3e-4/4e-4"):
        actor_config("kpo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actor_config("kpo", clip_ratio_low=3e-4, clip_ratio_high=4e-4)
        actor_config("vanilla")


def _drifting_batch(seed: int, rows: int = 8, tokens: int = 48):
    """Log-probs whose ratios drift along each response (a random walk seen with noise), right-padded."""
    g = torch.Generator().manual_seed(seed)
    walk = torch.cumsum(0.1 * torch.randn(rows, tokens, generator=g, dtype=torch.float64), dim=1)
    old = -torch.rand(rows, tokens, generator=g, dtype=torch.float64) - 3.0
    new = (old + walk + 0.3 * torch.randn(rows, tokens, generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = torch.arange(tokens)[None, :] < torch.randint(tokens // 2, tokens + 1, (rows, 1), generator=g)
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, tokens).clone()
    return new, old, adv, mask


def test_memory_auto_is_one_q_per_optimizer_step_for_any_micro_batch_size(tmp_path, monkeypatch):
    """Issue 46: q was fitted per micro-batch, so it changed with ppo_micro_batch_size_per_gpu, and the dumps
    re-fitted the mini-batch. Now every call of a step filters at one q, fitted on the whole previous step (the
    paper's q before any; a generation batch's first step is not fitted), the same for micro-batches of 2 and 8
    rows; each call is the fixed-q loss at that q; a dump records the q the step used."""
    import kpo.integrations.verl as plugin
    from kpo.analysis.dumps import load_dump
    from kpo.filter.fit import fit_q

    fn = get_policy_loss_fn("kpo_unclipped")
    steps = [_drifting_batch(seed) for seed in range(3)]
    seen = {}
    for size in (2, 8):
        monkeypatch.setattr(plugin, "_STEPS", plugin._OptimizerSteps())
        monkeypatch.setattr(plugin, "_FITS", {})
        monkeypatch.setattr(plugin, "_DUMPS", plugin.RatioDumps())
        folder = tmp_path / str(size)
        config = actor_config(
            "kpo_unclipped", memory="auto", dump_ratios_every=1, dump_ratios_dir=str(folder), steps_per_batch=3
        )
        config.global_batch_info.update(dp_size=2, batch_num_tokens=None, global_batch_size=16, loss_scale_factor=None)
        qs = []
        for new, old, adv, mask in steps:
            config.global_batch_info["batch_num_tokens"] = tokens = 2 * int(mask.sum())
            used = set()
            for first in range(0, 8, size):
                rows = slice(first, first + size)
                part = (new[rows], old[rows], adv[rows], mask[rows])
                loss, metrics = verl_call(fn, *part, "token-mean", config, None)
                q = metrics["actor/kpo/q"]
                fixed, _ = policy_loss(
                    "kpo_unclipped",
                    log_prob=part[0],
                    old_log_prob=part[1],
                    advantages=part[2],
                    response_mask=part[3],
                    loss_agg_mode="token-mean",
                    q=q,
                    global_num_seqs=16,
                    global_num_tokens=tokens,
                    dp_size=2,
                )
                assert torch.equal(loss, fixed)
                used.add(q)
            assert len(used) == 1
            qs.append(used.pop())
        # kpo_unclipped's paper q until a step is fitted: the batch's first step (on-policy) is not
        assert qs[0] == qs[1] == 1e-4
        new, old, _, mask = steps[1]
        assert qs[2] == pytest.approx(fit_q((new - old).detach(), mask), rel=1e-9)
        dump = load_dump(folder / "step_000003-rank0.safetensors")
        assert dump.meta_float("q") == pytest.approx(qs[2], rel=1e-12)
        seen[size] = qs
    assert seen[2] == pytest.approx(seen[8], rel=1e-9)


def test_memory_auto_bounds_are_numbers_not_booleans():
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor \(loss_mode='kpo'\): q_max must be a number > 0, got bool"):
        actor_config("kpo", memory="auto", q_max=True, steps_per_batch=2)


def _fitted_qs(batches, noise: float, monkeypatch) -> list[float]:
    """The q each optimizer step of ``batches`` (2 steps a generation batch) filters with, where the on-policy
    steps' log-ratios are i.i.d. noise of sd ``noise`` (verl's recomputed old log-probs beside the training
    forward, on a GPU) instead of exactly 0."""
    import kpo.integrations.verl as plugin

    monkeypatch.setattr(plugin, "_STEPS", plugin._OptimizerSteps())
    monkeypatch.setattr(plugin, "_FITS", {})
    config = actor_config("kpo", memory="auto", steps_per_batch=2)
    config.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=8, loss_scale_factor=None)
    g = torch.Generator().manual_seed(11)
    qs = []
    for step, (new, old, adv, mask) in enumerate(batches):
        if step % 2 == 0:  # on-policy: the same policy computed twice
            new = (old + noise * torch.randn(old.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
        _, metrics = verl_call(get_policy_loss_fn("kpo"), new, old, adv, mask, "token-mean", config, None)
        qs.append(metrics["actor/kpo/q"])
    return qs


def test_memory_auto_is_not_fitted_to_the_on_policy_step_s_noise(monkeypatch):
    """Issue 54: the fit took a batch's first step for a step of exactly-0 log-ratios; with i.i.d. noise of 1e-3
    there it fitted q = 1e-8 (a 10,000-token memory) and filtered the next, off-policy step with it. Now that step
    is not fitted: the q of every step is the same with and without the noise, and the off-policy steps' fit."""
    from kpo.filter.fit import fit_q

    batches = [_drifting_batch(seed) for seed in range(4)]
    clean, noisy = _fitted_qs(batches, 0.0, monkeypatch), _fitted_qs(batches, 1e-3, monkeypatch)
    assert noisy == clean
    new, old, _, mask = batches[1]  # the first batch's off-policy step: the q of the second batch's steps
    assert clean[:2] == [1e-6, 1e-6] and clean[2] == clean[3] == pytest.approx(fit_q((new - old).detach(), mask))


def test_memory_auto_needs_the_steps_of_a_generation_batch():
    with pytest.raises(ValueError, match=r"memory=auto fits q on the off-policy steps only: set \+actor_rollout_ref"):
        actor_config("kpo", memory="auto")
    with pytest.raises(ValueError, match=r"steps_per_batch=0: give the optimizer steps of a generation batch"):
        actor_config("kpo", steps_per_batch=0)


def test_dumps_are_written_once_per_sequence_parallel_group(tmp_path, monkeypatch):
    """Ulysses sequence parallelism: the ranks of an SP group hold the same rows (verl gathers their log-probs
    before the loss); only its first writes them, named by its data-parallel rank."""
    import kpo.integrations.verl as plugin

    new, old, adv, mask = _drifting_batch(0)
    for position in [(0, 0), (0, 1), (1, 0), (1, 1)]:  # ranks 0-3 of dp 2 x sp 2
        monkeypatch.setattr(plugin, "_STEPS", plugin._OptimizerSteps())
        monkeypatch.setattr(plugin, "_DUMPS", plugin.RatioDumps())
        monkeypatch.setattr(plugin, "mesh_position", lambda dp_size, position=position: position)
        config = actor_config("kpo", dump_ratios_every=1, dump_ratios_dir=str(tmp_path))
        config.global_batch_info.update(
            dp_size=2, batch_num_tokens=2 * int(mask.sum()), global_batch_size=16, loss_scale_factor=None
        )
        verl_call(get_policy_loss_fn("kpo"), new, old, adv, mask, "token-mean", config, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step_000001-rank{r}.safetensors" for r in (0, 1)]
