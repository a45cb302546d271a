"""The arrows run one way (DESIGN.md): shell -> upstreams, translate -> canonical step -> logprobs core -> schemas.

Every import in gateway/ and schemas/ is read with `ast` (also ones inside functions and under
TYPE_CHECKING: a type-only import still couples the layers) and checked against the layer each module
belongs to. A module may import its own package and any layer below; an import upward, or sideways
between `gateway.upstreams` and `gateway.translate`, fails with the file, line and the rule broken.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (name, rank, package prefixes): a module may import only modules of a lower rank, or its own layer.
LAYERS: list[tuple[str, int, tuple[str, ...]]] = [
    ("schemas", 0, ("schemas",)),
    ("errors", 0, ("gateway.errors",)),  # OpenAI-shaped errors, imported by every layer; imports nothing
    ("logprobs core", 1, ("gateway.logprobs",)),
    ("canonical step", 2, ("gateway.canonical",)),
    ("upstreams", 3, ("gateway.upstreams",)),
    ("translate", 3, ("gateway.translate",)),
]
SHELL = ("shell", 4, ("gateway",))  # app, cli, server, store, routing, simulator, ...: the rest of gateway/


def layer_of(module: str) -> tuple[str, int, tuple[str, ...]]:
    for layer in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in layer[2]):
            return layer
    return SHELL


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every gateway/schemas import in the file."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from gateway import upstreams` names a package, not an attribute: check it as one.
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                      if (root / Path(*f"{target}.{alias.name}".split("."))).is_dir()]
    return [(line, name) for line, name in found if name.split(".")[0] in ("gateway", "schemas")]


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted([*root.glob("gateway/**/*.py"), *root.glob("schemas/**/*.py")]):
        module = module_name(path, root)
        name, rank, _ = layer_of(module)
        for line, target in imports_of(path, root):
            if target == "gateway":
                continue  # the package root holds only __version__
            t_name, t_rank, _ = layer_of(target)
            if t_rank > rank or (t_rank == rank and t_name != name):
                kind = "upward" if t_rank > rank else "sideways"
                out.append(f"{path.relative_to(root)}:{line}: {module} ({name}) imports {target} ({t_name}): {kind}")
    return out


def test_every_import_in_gateway_runs_down_the_layers() -> None:
    found = violations()
    assert not found, "imports against the arrows of DESIGN.md:\n" + "\n".join(found)


def test_gateway_package_root_imports_nothing() -> None:
    """`import gateway` from any layer is allowed only because the root holds no imports of its own."""
    assert [name for _, name in imports_of(ROOT / "gateway" / "__init__.py")] == []


@pytest.mark.parametrize(("source", "expected"), [
    ("from gateway.routing import Route\n", "upward"),
    ("from gateway.translate.chat_template import render_prompt\n", "sideways"),
    ("def f():\n    from gateway.app import make_app\n", "upward"),
    ("from ..translate import stream\n", "sideways"),
    ("from gateway import translate\n", "sideways"),
])
def test_the_checker_catches_an_upward_or_sideways_import(tmp_path: Path, source: str, expected: str) -> None:
    """The check itself can fail: a dialect module importing the shell or a translator is reported."""
    fake_root = tmp_path
    (fake_root / "gateway" / "upstreams").mkdir(parents=True)
    (fake_root / "gateway" / "translate").mkdir()
    for init in ("gateway/__init__.py", "gateway/upstreams/__init__.py", "gateway/translate/__init__.py"):
        (fake_root / init).write_text("")
    (fake_root / "gateway" / "upstreams" / "bad.py").write_text(source)
    found = violations(fake_root)
    assert len(found) == 1 and found[0].startswith("gateway/upstreams/bad.py") and found[0].endswith(expected), found
