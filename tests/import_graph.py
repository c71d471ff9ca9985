"""The import graph of ``src/kpo``, read from the source (imports inside functions count: a lazy import is still a
dependency). Shared by the tests of the package's shape (``test_layout.py``, ``test_import_layers.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import kpo

SRC = Path(kpo.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the kpo modules it imports (``from pkg import name`` is the module ``pkg.name`` when that is
    one, else ``pkg``)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                if base not in modules:
                    continue
                subs = {f"{base}.{a.name}" for a in node.names}
                deps |= (subs & modules.keys()) or {base}
                if subs - modules.keys():
                    deps.add(base)
        graph[name] = deps - {name}
    return graph
