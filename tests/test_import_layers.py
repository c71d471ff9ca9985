"""The package's layers (docs/design.md, "Layers"): every module of ``src/kpo`` sits on one layer, and no module
imports one on a higher layer (imports inside functions count: a lazy import is still a dependency).

A package sits on its layer whole, except its command modules (``cli.py``, ``*_cli.py``), which parse, call and
print and sit on the cli layer, and the modules placed on their own below. A module this file does not place
fails the test: place it here.
"""

from __future__ import annotations

from import_graph import import_graph

LAYERS = ("base", "kernel", "domain", "engines", "cli")  # low to high

# module, or package with everything under it -> layer
PLACES = {
    # cli: the kpo command and the commands that are not an engine's own cli.py
    "kpo.cli": "cli",
    "kpo.__main__": "cli",
    "kpo.launch": "cli",
    "kpo.bench": "cli",
    # engines: run training, evaluation and comparisons in a host trainer
    "kpo.train": "engines",
    "kpo.integrations": "engines",
    "kpo.evaluation": "engines",
    "kpo.compare": "engines",
    "kpo.analysis": "engines",
    "kpo.generation": "engines",
    # domain: the formulas and data the engines consume; the public API facade (kpo) exports them
    "kpo": "domain",
    "kpo.losses": "domain",
    "kpo.advantages": "domain",
    "kpo.rewards": "domain",
    "kpo.data": "domain",
    "kpo.diagnostics": "domain",
    "kpo.protocol": "domain",
    "kpo.testbed": "domain",  # the embedded task, its model and files (its warm start trains in train/)
    # kernel: the Kalman filter
    "kpo.filter": "kernel",
    # base: private helpers any layer may use (files, progress, processes, lazy exports)
    "kpo._lazy": "base",
    "kpo._exit": "base",
    "kpo._files": "base",
    "kpo._checks": "base",
    "kpo._progress": "base",
    "kpo._distributed": "base",
}


def layer_of(module: str) -> str | None:
    """The layer of a module: a command module's is cli; else its own entry's, or its nearest package's (the
    top-level ``kpo`` entry places the package's ``__init__`` only)."""
    last = module.rpartition(".")[2]
    if module.count(".") >= 2 and (last == "cli" or last.endswith("_cli")):
        return "cli"
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        if (place := PLACES.get(".".join(parts[:end]))) is not None:
            return place
    return PLACES.get(module)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not unplaced, f"modules with no layer (add them to PLACES): {unplaced}"
    assert set(PLACES.values()) <= set(LAYERS)


def test_no_import_runs_up_the_layers():
    rank = {name: i for i, name in enumerate(LAYERS)}
    up = sorted(
        f"{module} ({layer_of(module)}) -> {dep} ({layer_of(dep)})"
        for module, deps in import_graph().items()
        for dep in deps
        if layer_of(module) and layer_of(dep) and rank[layer_of(dep)] > rank[layer_of(module)]
    )
    assert not up, "imports running up the layers:\n" + "\n".join(up)


def test_layers_of_sample_modules():
    assert layer_of("kpo") == "domain"
    assert layer_of("kpo.train.cli") == "cli" and layer_of("kpo.compare.study.cli") == "cli"
    assert layer_of("kpo.train.config") == "engines"
    assert layer_of("kpo.filter.scan") == "kernel"
    assert layer_of("kpo.nowhere") is None
