"""The package's shape: imports point one way, argparse only in the CLI, a light `attnlab --help`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "attnlab"
# higher layers may import lower ones, never the reverse (docs/design.md)
LAYERS = {
    "attnlab.cli": 5,
    "attnlab.commands": 5,
    "attnlab.__main__": 5,
    "attnlab.studies": 4,
    "attnlab.bench": 4,
    "attnlab.analysis": 4,
    "attnlab.train": 3,
    "attnlab.export": 3,
    "attnlab.model": 2,
    "attnlab.data": 2,
    "attnlab.rundir": 2,
    "attnlab.device": 2,
    "attnlab.plotting": 2,
    "attnlab.config": 1,
    "attnlab.presets": 1,
    "attnlab.field_help": 1,
    "attnlab.fsutil": 1,
    "attnlab.errors": 0,
    "attnlab.reporting": 0,
    # the package's facade (its own imports are lazy): each name counts as where it lives
    "attnlab": 0,
    "attnlab.from_pretrained": 3,
    "attnlab.GPT": 2,
    "attnlab.ModelConfig": 1,
    "attnlab.TrainConfig": 1,
}


def layer(module: str) -> int:
    while module not in LAYERS:
        module = module.rpartition(".")[0]
    return LAYERS[module]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import mod`
    return found


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "remote" not in p.parts)


def test_imports_point_down() -> None:
    upward = []
    for path in sources():
        me = module_name(path)
        if me == "attnlab":
            continue  # the lazy facade: its names are mapped to where they live above
        for name in imports(path):
            if name.startswith("attnlab") and layer(name) > layer(me):
                upward.append(f"{me} -> {name}")
    assert upward == []


def test_argparse_only_in_the_cli() -> None:
    users = [
        module_name(p)
        for p in sources()
        if "argparse" in imports(p) and layer(module_name(p)) < LAYERS["attnlab.cli"]
    ]
    assert users == []


def test_help_loads_neither_torch_nor_numpy() -> None:
    code = (
        "import sys\n"
        "from attnlab.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.splitlines()[-1] == "[]"


def test_no_two_parts_of_the_package_import_each_other() -> None:
    """Within a layer imports may go either way, but not both: train reading exports through
    export while export saves through train made the two one tangle."""

    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges = {
        (part(module_name(path)), part(name))
        for path in sources()
        for name in imports(path)
        if name.startswith("attnlab.") and part(name) != part(module_name(path))
    }
    both = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert both == []
