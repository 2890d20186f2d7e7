"""The house: each package's rooms, what may import what, and the folder map in the docs.

The import-linter contracts in ``pyproject.toml`` hold the layer rule between folders;
these tests hold what a contract cannot say: the names of the rooms, unique module names,
the short public surface of ``server_ext`` and that ``docs/design.md`` maps the tree.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import server_ext

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("txsink", "coordinator", "server_ext")


def modules(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py")
                  if "__pycache__" not in p.parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (``from a import b`` counts
    ``a.b`` where ``b`` is a module of ``a``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            folder = ROOT / node.module.replace(".", "/")
            names.update(f"{node.module}.{alias.name}" for alias in node.names
                         if (folder / f"{alias.name}.py").exists()
                         and alias.name not in _exported(node.module))
    return names


def _exported(module: str) -> set[str]:
    """The public names a folder's ``__init__`` lists (``__all__``), read, not imported."""
    init = ROOT / module.replace(".", "/") / "__init__.py"
    if not init.exists():
        return set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def package_folders(package: str) -> set[str]:
    return {str(p.parent.relative_to(ROOT)) for p in (ROOT / package).rglob("__init__.py")
            if "__pycache__" not in p.parts}


def test_the_sink_has_four_rooms_and_nothing_else_at_its_top() -> None:
    top = {p.name for p in (ROOT / "txsink").iterdir() if p.name != "__pycache__"}
    assert top == {"__init__.py", "__main__.py", "spark", "core", "options", "ops"}


def test_only_the_spark_room_imports_sparks_data_source_api() -> None:
    spark_room = ROOT / "txsink" / "spark"
    offenders = [str(p.relative_to(ROOT)) for p in modules(*PRODUCT)
                 if spark_room not in p.parents
                 and any(name.startswith("pyspark.sql.datasource") for name in imported(p))]
    assert offenders == []


def test_no_two_product_modules_share_a_name() -> None:
    names = Counter(p.name for p in modules(*PRODUCT)
                    if p.name not in ("__init__.py", "__main__.py")
                    and not (p.name == "errors.py" and p.parent.name in PRODUCT))
    assert [name for name, count in names.items() if count > 1] == []


def test_server_ext_exports_a_short_list() -> None:
    assert len(server_ext.__all__) <= 25


def test_the_sink_reaches_server_ext_through_its_folders_public_names() -> None:
    """``server_ext`` or ``server_ext.<folder>``, never a module inside a folder."""
    folders = {p.parent.name for p in (ROOT / "server_ext").glob("*/__init__.py")}
    deep = re.compile(rf"^server_ext\.({'|'.join(folders)})\.[a-z_]+$")
    modules_of = {f"server_ext.{p.relative_to(ROOT / 'server_ext').with_suffix('')}"
                  .replace("/", ".") for p in modules("server_ext")}
    offenders = sorted(f"{p.relative_to(ROOT)}: {name}"
                       for p in modules("txsink", "benchmarks")
                       for name in imported(p) if deep.match(name) and name in modules_of)
    assert offenders == []


def test_the_harness_is_not_part_of_the_wheel() -> None:
    config = (ROOT / "pyproject.toml").read_text()
    include = re.search(r'^include = \[(.*)\]$', config, re.M)
    assert include is not None
    assert "tests" not in include.group(1)


def mapped_folders() -> set[str]:
    """The folders ``docs/design.md``'s folder map names: a package in bold, its folders
    as bullets below it (``- `spark/` — …``, relative to the package), a folder's own
    folders as bullets below its bullet."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design.split("## Folder map", 1)[1].split("\n## ", 1)[0]
    mapped: set[str] = set()
    package = folder = ""
    for line in section.splitlines():
        if found := re.match(r"\*\*`([\w/]+)/`\*\*", line):
            package = found.group(1)
            mapped.add(package)
        elif found := re.match(r"- `([\w/]+)/`", line):
            folder = f"{package}/{found.group(1)}"
            mapped.add(folder)
        elif found := re.match(r"  - `([\w/]+)/`", line):
            mapped.add(f"{folder}/{found.group(1)}")
    return mapped


def test_design_maps_every_package_folder_and_only_folders_that_exist() -> None:
    mapped = mapped_folders()
    folders = set().union(*(package_folders(p) for p in PRODUCT)) | {"tests/harness"}
    assert folders - mapped == set(), "folders missing from docs/design.md's map"
    assert {m for m in mapped if not (ROOT / m).is_dir()} == set(), "mapped, not in the tree"
