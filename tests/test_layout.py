"""The house: each package's rooms, what may import what, and the folder map in the docs.

The import-linter contracts in ``pyproject.toml`` hold the layer rule between folders and
inside some; these tests hold what a contract cannot say: the names of the rooms, unique
module names, no import circle anywhere in the product, the short public surface of
``server_ext`` and that ``docs/design.md`` maps the tree.
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


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere in the file: at its top,
    inside functions, under ``TYPE_CHECKING``, relative or not. ``from a import b`` is
    ``a.b`` where that is a module, else ``a``; a name of no module is its nearest
    enclosing module."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package, one level up per dot
                base = ".".join([*package[:len(package) - node.level + 1],
                                 *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path, *packages: str) -> dict[str, set[str]]:
    """Each module of ``packages`` (under ``root``) and the modules of them it imports."""
    paths = {module_name(p, root): p for package in packages
             for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts}
    return {name: imports_of(path, set(paths), root) for name, path in paths.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A circle (its modules, the first repeated at the end) for each back edge of a
    depth-first walk of ``graph``: empty exactly when the graph has no circle."""
    circles: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []  # the walk's modules from its start to the current one

    def visit(module: str) -> None:
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if target in path:
                circles.append([*path[path.index(target):], target])
            elif target not in done:
                visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return circles


def test_the_circle_finder_counts_imports_in_functions_under_type_checking_and_relative(
        tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from .c import C\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from pkg.a import f\nfrom pkg import c\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.d"] == {"pkg.a", "pkg.c"}
    assert import_circles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert import_circles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_no_import_circle_among_the_product_modules() -> None:
    """Every import counted: a circle that only an import inside a function or under
    ``TYPE_CHECKING`` closes still ties its modules together."""
    assert import_circles(import_graph(ROOT, *PRODUCT)) == []


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
