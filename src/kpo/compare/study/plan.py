"""A study's plan: the file a user writes (YAML or JSON), checked whole before anything is trained, and its
canonical form, ``plan.json``, which ``--register`` writes once and every later command reads.

Every key of the file: docs/study.md; a complete one: examples/study/plan.yaml.

:func:`plan_errors` lists every problem at once, one line each; :func:`load_plan` reads a plan.json (this format,
version 2, or the first study's version 1, read as it was registered) and refuses one that is not valid.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import yaml

from kpo.compare.cell import MISMATCH, Cell, parse_cell
from kpo.compare.engines import engine_of
from kpo.compare.plan import CompareConfig, CompareError, Run
from kpo.compare.stats import MOST_SEEDS

__all__ = ["PLAN_FILE", "cell_arms", "cell_config", "collapsed", "group_arms", "load_plan", "normalize", "plan_errors",
           "plan_from", "read_plan_file", "rule_text", "run_name", "run_of"]

PLAN_FILE = "plan.json"
OUTCOMES = ("collapse", "accuracy", "metric")
ALTERNATIVES = ("two-sided", "greater", "less")
ROLES = ("primary", "family", "descriptive")
TESTS = ("sign-flip", "mcnemar-pairs")  # mcnemar-pairs: the first study's collapse test, (cell, seed) pairs
COLLAPSE_RULES = ("below_fraction_of_warm", "below_absolute")
SETUP = {  # kpo compare's settings a study's runs share, and their defaults
    "engine": "kpo",
    "model": None,
    "dataset": None,
    "eval_data": [],
    "verl_config": None,
    "train_args": [],
    "batches": 20,
    "eval_n": 4,
    "eval_limit": None,
    "keep": "hf",
}
TOP = ("version", "title", "alpha", "setup", "seeds", "collapse", "sensitivity", "arms", "cells", "groups",
       "questions", "sizing")
REGISTERED = ("simulation", "runs_at_most", "registered", "source")  # what --register adds
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_KEY = re.compile(r"[a-z][a-z0-9_]*\Z")


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (PyYAML keeps the last silently)."""


def _mapping(loader, node, deep=False):
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if twice:
        raise yaml.constructor.ConstructorError(None, None, f"key(s) {twice} written twice", node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
# YAML 1.1 reads 5e-4 (no dot) as text; a learning rate written so is a number
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _unique_pairs(pairs):
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"key(s) {twice} written twice")
    return dict(pairs)


def read_data_file(path: Path, what: str):
    """A JSON (``.json``) or YAML file's contents, or None where there is none; CompareError in one line where it
    is not UTF-8, does not parse, or writes a key twice in one mapping (as a merge of two files can)."""
    path = Path(path)
    if path.is_dir():
        raise CompareError([f"{path}: a folder, not {what}; give the file"])
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise CompareError([f"{path}: {what} is not UTF-8 text (byte {e.start}); save it as UTF-8"]) from None
    try:
        if path.suffix == ".json":
            return json.loads(text, object_pairs_hook=_unique_pairs)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except (ValueError, yaml.YAMLError) as e:
        why = str(e).replace("\n", " ")
        raise CompareError([f"{path}: {what} does not parse ({why}); fix it or restore it from git"]) from None


def read_plan_file(path: Path) -> dict:
    """The plan a user wrote (YAML or JSON), not yet checked; CompareError in one line when it is not a mapping."""
    raw = read_data_file(path, "the plan")
    if raw is None:
        raise CompareError([f"{path}: no such plan file; write one (docs/study.md has an example)"])
    if not isinstance(raw, dict):
        raise CompareError([f"{path}: the plan is a {type(raw).__name__}, not a mapping of {', '.join(TOP[1:])}"])
    return raw


# ------------------------------------------------------------------ collapse
def collapsed(accuracy: float, warm: float, rule: dict) -> bool:
    """Whether a run whose final accuracy is ``accuracy`` (a fraction) collapsed from its seed's warm start ``warm``
    under ``rule`` ({"rule": "below_fraction_of_warm" | "below_absolute", "value"})."""
    if rule["rule"] == "below_fraction_of_warm":
        return accuracy < rule["value"] * warm
    if rule["rule"] == "below_absolute":
        return accuracy < rule["value"]
    raise ValueError(f"collapse rule {rule['rule']!r}: use {' or '.join(COLLAPSE_RULES)}")


def rule_text(rule: dict) -> str:
    if rule["rule"] == "below_absolute":
        return f"final accuracy below {100 * rule['value']:g}%"
    if rule["value"] == 1.0:
        return "final accuracy below its warm start's"
    return f"final accuracy below {rule['value']:g} x its warm start's"


def _rule_errors(rule, where: str) -> list[str]:
    if not isinstance(rule, dict) or set(rule) != {"rule", "value"}:
        return [f"{where}: write {{rule: below_fraction_of_warm or below_absolute, value: a number}}"]
    if rule["rule"] not in COLLAPSE_RULES:
        return [f"{where}: rule {rule['rule']!r} is not one of {', '.join(COLLAPSE_RULES)}"]
    if not _number(rule["value"]) or not 0 < rule["value"] <= (1 if rule["rule"] == "below_absolute" else 10):
        return [f"{where}: value {rule['value']!r} must be a number above 0 (a fraction of accuracy or of the warm start's)"]
    return []


# ------------------------------------------------------------------ checks
def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _strings(x) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) for s in x)


def _flags(x) -> bool:
    """A list of command-line words; YAML may have read a number among them (1e-4) as a number."""
    return isinstance(x, list) and all(isinstance(s, (str, int, float)) and not isinstance(s, bool) for s in x)


def _words(x: list) -> list[str]:
    return [s if isinstance(s, str) else repr(s) for s in x]


def group_arms(plan: dict, group: str) -> list[str]:
    """The arms a group trains: those its questions name, in the plan's order of arms."""
    named = {arm for q in plan["questions"] if q["group"] == group for arm in (q["a"], q["b"])}
    return [a for a in plan["arms"] if a in named]


def cell_arms(plan: dict):
    """(cell, arm) of every run the plan can train: each group's cells by the arms the group trains."""
    for group, g in plan["groups"].items():
        for cell in g["cells"]:
            for arm in group_arms(plan, group):
                yield cell, arm


def plan_errors(raw: dict, *, version1: bool = False) -> list[str]:
    """Every problem of a plan (a user's file, or a plan.json), one line each naming where it is and the fix;
    empty when the plan can be registered. Settings an engine checks (a loss's keywords, a flag) are checked at
    registration by the engine itself. ``version1``: the first study's plan, whose collapse questions were
    registered on (cell, seed) pairs."""
    from kpo.losses import list_losses

    errors = [f"unknown key {k!r}: a plan has {', '.join(TOP[1:])}" for k in raw if k not in TOP + REGISTERED]
    if raw.get("version", 2) != 2:
        errors.append(f"version {raw.get('version')!r}: this kpo reads plans of version 2 (omit it)")
    if not isinstance(raw.get("title"), str) or not raw["title"].strip():
        errors.append("title: missing; say in a few words what the study asks")
    alpha = raw.get("alpha", 0.05)
    if not _number(alpha) or not 0 < alpha <= 0.5:
        errors.append(f"alpha {alpha!r}: give the family-wise error, a number in (0, 0.5], e.g. 0.05")
        alpha = 0.05
    setup = raw.get("setup", {})
    if not isinstance(setup, dict):
        errors.append("setup: a mapping of kpo compare's settings (engine, model, dataset, ...)")
        setup = {}
    errors += [f"setup: unknown key {k!r}; use {', '.join(SETUP)}" for k in setup if k not in SETUP]
    for key in ("batches", "eval_n"):
        if key in setup and not (_integer(setup[key]) and setup[key] >= 1):
            errors.append(f"setup.{key} {setup[key]!r}: an integer >= 1")
    if "train_args" in setup and not _flags(setup["train_args"]):
        errors.append("setup.train_args: a list of the engine's command-line words")
    if "eval_data" in setup and not _strings(setup["eval_data"]):
        errors.append("setup.eval_data: a list of file paths")
    seeds = raw.get("seeds", {})
    if not (isinstance(seeds, dict) and set(seeds) <= {"first"} and _integer(seeds.get("first", 0))
            and seeds.get("first", 0) >= 0):
        errors.append("seeds: write {first: N}, N the first seed (an integer >= 0; seeds are taken in order)")
    errors += _rule_errors(raw.get("collapse", {"rule": "below_fraction_of_warm", "value": 0.5}), "collapse")
    sensitivity = raw.get("sensitivity", [])
    if not isinstance(sensitivity, list):
        errors.append("sensitivity: a list of collapse rules")
    else:
        errors += [e for i, r in enumerate(sensitivity) for e in _rule_errors(r, f"sensitivity[{i}]")]

    arms = raw.get("arms")
    if not isinstance(arms, dict) or not arms:
        errors.append("arms: none; give label: {loss: NAME, loss_kwargs: {...}} for each arm")
        arms = {}
    losses, settings = set(list_losses()), {}
    for label, arm in arms.items():
        where = f"arm {label!r}"
        if not isinstance(arm, dict) or "loss" not in arm:
            errors.append(f"{where}: write {{loss: NAME, loss_kwargs: {{...}}, train_args: [...]}}")
            continue
        errors += [f"{where}: unknown key {k!r}; use loss, loss_kwargs, train_args" for k in arm
                   if k not in ("loss", "loss_kwargs", "train_args")]
        if arm["loss"] not in losses:
            errors.append(f"{where}: loss {arm['loss']!r} is not one of kpo's: {', '.join(sorted(losses))}")
        kwargs = arm.get("loss_kwargs", {})
        if not isinstance(kwargs, dict) or not all(isinstance(v, (str, int, float)) for v in kwargs.values()):
            errors.append(f"{where}: loss_kwargs is a mapping of names to numbers or words")
            kwargs = {}
        if not _flags(arm.get("train_args", [])):
            errors.append(f"{where}: train_args is a list of the engine's command-line words")
        same = (arm["loss"], json.dumps(kwargs, sort_keys=True), json.dumps(arm.get("train_args", [])))
        if same in settings:
            errors.append(f"{where}: the same run as arm {settings[same]!r} (one setting, one arm)")
        settings.setdefault(same, label)

    cells = raw.get("cells")
    if not isinstance(cells, dict) or not cells:
        errors.append("cells: none; give name: {mismatch: none, depth: 4, lr: 1.0e-4} for each cell")
        cells = {}
    for name, cell in cells.items():
        where = f"cell {name!r}"
        if not _NAME.match(str(name)):
            errors.append(f"{where}: a folder name: letters, digits, '.', '_' and '-', e.g. none-depth4-lr0.0005")
        if not isinstance(cell, dict):
            errors.append(f"{where}: write {{mismatch: none, depth: 4, lr: 1.0e-4, train_args: [...]}}")
            continue
        errors += [f"{where}: unknown key {k!r}; use mismatch, depth, lr, train_args" for k in cell
                   if k not in ("mismatch", "depth", "lr", "train_args")]
        if cell.get("mismatch", "none") not in MISMATCH:
            errors.append(f"{where}: mismatch {cell.get('mismatch')!r} is not one of {', '.join(MISMATCH)}")
        if not (_integer(cell.get("depth")) and cell["depth"] >= 1):
            errors.append(f"{where}: depth {cell.get('depth')!r}: optimizer steps per generation batch, an integer >= 1")
        if not (_number(cell.get("lr")) and cell["lr"] > 0):
            errors.append(f"{where}: lr {cell.get('lr')!r}: a learning rate, a number > 0")
        if not _flags(cell.get("train_args", [])):
            errors.append(f"{where}: train_args is a list of the engine's command-line words")

    groups = raw.get("groups")
    if not isinstance(groups, dict) or not groups:
        errors.append("groups: none; give name: {cells: [...], looks: [N, ...]} (or looks: anytime, max_seeds: N)")
        groups = {}
    owner: dict[str, str] = {}
    for name, group in groups.items():
        errors += _group_errors(name, group, cells, owner, alpha)

    questions = raw.get("questions")
    if not isinstance(questions, list) or not questions:
        errors.append("questions: none; list them in order (key, text, outcome, a, b, group, role)")
        questions = []
    seen_keys, seen_asks = set(), {}
    tests = TESTS if version1 else TESTS[:1]
    for i, q in enumerate(questions):
        errors += _question_errors(i, q, arms, groups, seen_keys, seen_asks, tests)
    roles = [q.get("role", "family") for q in questions if isinstance(q, dict)]
    if roles.count("primary") > 1:
        errors.append(f"questions: {roles.count('primary')} primaries; at most one question is the gate (role: primary)")
    if questions and all(r == "descriptive" for r in roles):
        errors.append("questions: every one is descriptive; a study tests at least one (role: primary or family)")
    used_arms = {q.get(s) for q in questions if isinstance(q, dict) for s in ("a", "b")}
    errors += [f"arm {a!r}: no question reads it; remove it or ask about it" for a in arms if a not in used_arms]
    used_groups = {q.get("group") for q in questions if isinstance(q, dict)}
    errors += [f"group {g!r}: no question reads it; remove it or ask about it" for g in groups if g not in used_groups]
    errors += [f"cell {c!r}: in no group; add it to one or remove it" for c in cells if c not in owner]
    errors += _sizing_errors(raw.get("sizing", {}))
    return errors


def _group_errors(name: str, group, cells: dict, owner: dict, alpha: float) -> list[str]:
    where = f"group {name!r}"
    if not isinstance(group, dict):
        return [f"{where}: write {{cells: [...], looks: [N, ...]}}"]
    errors = [f"{where}: unknown key {k!r}; use cells, looks, spending, max_seeds" for k in group
              if k not in ("cells", "looks", "spending", "max_seeds")]
    members = group.get("cells")
    if not _strings(members) or not members:
        errors.append(f"{where}: cells is a list of the plan's cell names")
        members = []
    for c in members:
        if c not in cells:
            errors.append(f"{where}: cell {c!r} is not one of the plan's cells ({', '.join(cells)})")
        elif c in owner and owner[c] != name:
            errors.append(f"{where}: cell {c!r} is in group {owner[c]!r} too; a cell belongs to one group")
        owner.setdefault(c, name)
    if len(set(members)) < len(members):
        errors.append(f"{where}: a cell listed twice")
    looks = group.get("looks")
    if looks == "anytime":
        if not (_integer(group.get("max_seeds")) and 2 <= group["max_seeds"] <= MOST_SEEDS):
            errors.append(f"{where}: looks: anytime needs max_seeds, the most seeds it runs (an integer from 2 to "
                          f"{MOST_SEEDS})")
        if "spending" in group:
            errors.append(f"{where}: looks at any time spend no error per look; remove spending")
        return errors
    if "max_seeds" in group:
        errors.append(f"{where}: max_seeds goes with looks: anytime; with looks [N, ...] the last look is the cap")
    if not (isinstance(looks, list) and looks and all(_integer(n) and 1 <= n <= MOST_SEEDS for n in looks)):
        return errors + [f"{where}: looks is a list of seeds at each look (1 to {MOST_SEEDS}), e.g. [14, 28], or anytime"]
    if any(b <= a for a, b in zip(looks, looks[1:])):
        errors.append(f"{where}: looks {looks} must grow (seeds at each look, in order)")
    spending = group.get("spending", "obrien-fleming")
    if spending != "obrien-fleming":
        if not (isinstance(spending, list) and len(spending) == len(looks) and all(_number(s) and s > 0 for s in spending)):
            errors.append(f"{where}: spending is obrien-fleming or one positive share of alpha per look ({len(looks)})")
        elif abs(sum(spending) - alpha) > 1e-9:
            errors.append(f"{where}: spending adds up to {sum(spending):g}, not alpha {alpha:g}; make them agree")
    return errors


def _question_errors(i: int, q, arms: dict, groups: dict, seen_keys: set, seen_asks: dict, tests) -> list[str]:
    where = f"questions[{i}]"
    if not isinstance(q, dict):
        return [f"{where}: a mapping (key, text, outcome, a, b, group, role, ...)"]
    known = ("key", "text", "why", "outcome", "metric", "a", "b", "group", "cells", "versus", "alternative", "margin",
             "role", "test", "scale")
    errors = [f"{where}: unknown key {k!r}; use {', '.join(known)}" for k in q if k not in known]
    key = q.get("key")
    if not (isinstance(key, str) and _KEY.match(key)):
        errors.append(f"{where}: key {key!r}: a short name of lower-case letters, digits and _")
    elif key in seen_keys:
        errors.append(f"{where}: key {key!r} used twice")
    seen_keys.add(key)
    where = f"question {key!r}" if isinstance(key, str) else where
    if not isinstance(q.get("text"), str) or not q["text"].strip():
        errors.append(f"{where}: text: the question in words")
    if not isinstance(q.get("why", ""), str):
        errors.append(f"{where}: why: in words, why the study asks it")
    outcome = q.get("outcome")
    if outcome not in OUTCOMES:
        errors.append(f"{where}: outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    if (outcome == "metric") != (q.get("metric") is not None):
        errors.append(f"{where}: metric names a metrics.jsonl column, with outcome: metric only")
    for side in ("a", "b"):
        if q.get(side) not in arms:
            errors.append(f"{where}: {side} {q.get(side)!r} is not one of the arms ({', '.join(map(str, arms))})")
    if q.get("a") == q.get("b"):
        errors.append(f"{where}: a and b are the same arm")
    group = q.get("group")
    if group not in groups:
        errors.append(f"{where}: group {group!r} is not one of the groups ({', '.join(groups)})")
    elif isinstance(groups[group], dict):
        members = groups[group].get("cells") or []
        if "cells" in q and (not _strings(q["cells"]) or not q["cells"] or not set(q["cells"]) <= set(members)):
            errors.append(f"{where}: cells must be some of its group's ({', '.join(map(str, members))})")
        mine = q.get("cells") or []
        if "versus" in q and not (_strings(q["versus"]) and _strings(mine) and set(q["versus"]) <= set(members)
                                  and len(q["versus"]) == len(mine) and not set(q["versus"]) & set(mine)):
            errors.append(f"{where}: versus: as many of its group's cells as its cells, none of them (a - b in its cells "
                          "against a - b in these: does the cells' setting change the contrast?)")
    if q.get("alternative", "two-sided") not in ALTERNATIVES:
        errors.append(f"{where}: alternative {q.get('alternative')!r} is not one of {', '.join(ALTERNATIVES)}")
    margin = q.get("margin", 0.0)
    if not (_number(margin) and margin >= 0):
        errors.append(f"{where}: margin {margin!r}: a number >= 0 (non-inferiority: in the outcome's units)")
    elif margin and q.get("alternative", "two-sided") == "two-sided":
        errors.append(f"{where}: a margin tests one side: give alternative greater (a not worse than b by more "
                      "than the margin) or less")
    if q.get("role", "family") not in ROLES:
        errors.append(f"{where}: role {q.get('role')!r} is not one of {', '.join(ROLES)}")
    if q.get("test", "sign-flip") not in tests or (q.get("test") == "mcnemar-pairs" and outcome != "collapse"):
        errors.append(f"{where}: test {q.get('test')!r}: sign-flip (the seed as the unit); omit it")
    if "scale" in q and not (_number(q["scale"]) and q["scale"] > 0):
        errors.append(f"{where}: scale {q['scale']!r}: a number > 0 (the difference a look at any time bets fully on)")
    ask = (q.get("outcome"), q.get("metric"), *sorted(map(str, (q.get("a"), q.get("b")))), group,
           json.dumps(sorted(q.get("cells") or [])), json.dumps(sorted(q.get("versus") or [])))
    if ask in seen_asks:
        errors.append(f"{where}: asks what {seen_asks[ask]!r} asks (the same arms, outcome, group and cells)")
    seen_asks.setdefault(ask, key)
    return errors


def _sizing_errors(sizing) -> list[str]:
    if not isinstance(sizing, dict):
        return ["sizing: a mapping (pilot, effects, sims)"]
    errors = [f"sizing: unknown key {k!r}; use pilot, effects, sims, seed" for k in sizing
              if k not in ("pilot", "effects", "sims", "seed")]
    sims = sizing.get("sims", 2000)
    if not (_integer(sims) and 100 <= sims <= 100_000):
        errors.append(f"sizing.sims {sims!r}: simulated studies, an integer from 100 to 100000")
    pilot = sizing.get("pilot")
    if pilot is not None and not (isinstance(pilot, dict) and isinstance(pilot.get("records"), str)
                                  and set(pilot) <= {"records", "cells", "arms"}):
        errors.append("sizing.pilot: write {records: PATH (a study's or a regime map's runs.json), "
                      "cells: {plan cell: pilot cell}, arms: {plan arm: pilot arm}}")
    effects = sizing.get("effects", {})
    if not isinstance(effects, dict) or not all(isinstance(e, dict) for e in effects.values()):
        errors.append("sizing.effects: question key -> {mean, sd} (accuracy, metric) or {a_rate, b_rate} (collapse)")
    return errors


# ------------------------------------------------------------------ the canonical plan
def normalize(raw: dict) -> dict:
    """The plan with every default filled in and in the order plan.json keeps (the checks passed)."""
    groups = {}
    for name, g in raw["groups"].items():
        groups[name] = {"cells": list(g["cells"]), "looks": g["looks"]}
        if g["looks"] == "anytime":
            groups[name]["max_seeds"] = g["max_seeds"]
        else:
            groups[name]["spending"] = g.get("spending", "obrien-fleming")
    questions = [
        {
            "key": q["key"],
            "text": q["text"],
            "outcome": q["outcome"],
            "metric": q.get("metric"),
            "a": q["a"],
            "b": q["b"],
            "group": q["group"],
            "cells": list(q.get("cells") or raw["groups"][q["group"]]["cells"]),
            **({"versus": list(q["versus"])} if q.get("versus") else {}),
            "alternative": q.get("alternative", "two-sided"),
            "margin": float(q.get("margin", 0.0)),
            "role": q.get("role", "family"),
            "test": q.get("test", "sign-flip"),
            **({"scale": float(q["scale"])} if "scale" in q else {}),
            **({"why": q["why"]} if q.get("why") else {}),
        }
        for q in raw["questions"]
    ]
    plan = {
        "version": 2,
        "title": raw["title"].strip(),
        "alpha": float(raw.get("alpha", 0.05)),
        "setup": {k: raw.get("setup", {}).get(k, v) for k, v in SETUP.items()}
        | {"train_args": _words(raw.get("setup", {}).get("train_args", []))},
        "seeds": {"first": raw.get("seeds", {}).get("first", 0)},
        "collapse": raw.get("collapse", {"rule": "below_fraction_of_warm", "value": 0.5}),
        "sensitivity": list(raw.get("sensitivity", [])),
        "arms": {label: {"loss": a["loss"], "loss_kwargs": dict(a.get("loss_kwargs", {})),
                         "train_args": _words(a.get("train_args", []))} for label, a in raw["arms"].items()},
        "cells": {name: {"mismatch": c.get("mismatch", "none"), "depth": c["depth"], "lr": float(c["lr"]),
                         "train_args": _words(c.get("train_args", []))} for name, c in raw["cells"].items()},
        "groups": groups,
        "questions": questions,
        "sizing": dict(raw.get("sizing", {})),
    }
    return plan | {k: raw[k] for k in REGISTERED if k in raw}


def from_version1(old: dict) -> dict:
    """The first study's plan.json (version 1, registered before this format) in this format, as it was
    registered: its collapse questions' test is the exact McNemar test on (cell, seed) pairs, its looks and
    spending its own, its arms and runs the same runs (:func:`run_name` gives its record keys)."""
    cells = {}
    for g in old["groups"].values():
        for name in g["cells"]:
            cell = parse_cell(name)
            cells[name] = {"mismatch": cell.mismatch, "depth": cell.depth, "lr": cell.lr}
    settings = old["run_settings"]
    raw = {
        "title": "the first study: where KPO helps",
        "alpha": old["alpha"],
        "setup": {"batches": settings["batches"], "eval_n": settings["eval_n"],
                  "eval_limit": settings["eval_limit"], "train_args": list(settings["train_args"])},
        "seeds": {"first": old["first_seed"]},
        "collapse": old["collapse"],
        "sensitivity": old["sensitivity"],
        "arms": {label: {"loss": a["method"], "loss_kwargs": dict(a["loss_kwargs"])} for label, a in old["arms"].items()},
        "cells": cells,
        "groups": {g: {"cells": v["cells"], "looks": v["looks"], "spending": v["spending"]} for g, v in old["groups"].items()},
        "questions": [
            {"key": q["key"], "text": q["text"], "outcome": q["kind"], "a": q["a"], "b": q["b"], "group": q["group"],
             "cells": q["cells"], "role": q["role"], "test": "mcnemar-pairs" if q["kind"] == "collapse" else "sign-flip"}
            for q in old["questions"]
        ],
        "simulation": old["simulation"],
        "runs_at_most": old["runs_at_most"],
        "registered": old["registered"],
    }
    errors = plan_errors(raw, version1=True)
    if errors:
        raise CompareError([f"version 1 plan: {e}" for e in errors])
    return normalize(raw) | {"version": 1}


def plan_from(raw, source: str) -> dict:
    """A plan.json's contents, checked (version 2) or converted (version 1); CompareError in one line per problem,
    each prefixed with ``source``."""
    if isinstance(raw, dict) and raw.get("study") == "confirmatory" and "run_settings" in raw:
        return from_version1(raw)
    if not isinstance(raw, dict) or not {"questions", "arms", "groups"} <= set(raw):
        raise CompareError([f"{source}: not a study's plan (a mapping of questions, arms, groups, ...); give the "
                            "study's plan.json"])
    errors = plan_errors(raw)
    if errors:
        raise CompareError([f"{source}: {e}" for e in errors])
    return normalize(raw)


def load_plan(path: Path) -> dict:
    """The plan.json at ``path`` (:func:`plan_from`)."""
    raw = read_data_file(Path(path), "the plan")
    if raw is None:
        raise CompareError([f"{path}: no plan there; register one (kpo compare study --plan FILE --register)"])
    return plan_from(raw, str(path))


# ------------------------------------------------------------------ runs
def run_of(plan: dict, arm: str, seed: int) -> Run:
    a = plan["arms"][arm]
    return Run(a["loss"], seed, tuple(a["loss_kwargs"].items()))


def run_name(plan: dict, arm: str, seed: int) -> str:
    """The run's folder and record name: kpo compare's (method, keywords, seed) where the arm has no trainer flags
    of its own, else the arm's label made a folder name."""
    if not plan["arms"][arm]["train_args"]:
        return run_of(plan, arm, seed).name
    return f"{re.sub(r'[^A-Za-z0-9.]+', '-', arm).strip('-').lower()}-seed{seed}"


def cell_config(plan: dict, cell: str, arm: str, runs: Path) -> CompareConfig:
    """The comparison settings that train ``arm`` in ``cell`` (its folder under ``runs``): the plan's setup's
    generation batches of the cell's depth in optimizer steps, 16 ratio dumps a run whatever the depth (steps 5k at
    depth 4 are off-policy for k not = 1 mod 4); in its flags the engine's own settings of the cell (sampler, depth,
    learning rate) first, then the cell's, the setup's and the arm's."""
    setup, c = plan["setup"], plan["cells"][cell]
    shared = {k: setup[k] for k in ("eval_n", "eval_limit", "engine", "model", "dataset", "verl_config", "keep")}
    steps = setup["batches"] * c["depth"]
    cfg = CompareConfig(
        out=str(Path(runs) / cell), steps=steps, minibatches=c["depth"], dump_every=max(1, steps // 16),
        methods=(plan["arms"][arm]["loss"],), seeds=1, matched=False, ablations=False, aa_seeds=0,
        eval_data=tuple(setup["eval_data"]), **shared,
    )
    own = (*c["train_args"], *setup["train_args"], *plan["arms"][arm]["train_args"])
    cfg.train_args = (*engine_of(cfg).cell_settings(Cell(c["mismatch"], c["depth"], c["lr"])), *own)
    return cfg
