"""The import direction tells the layers (DESIGN.md, "Code"): the collective engine
and its parts know no dialect's frames, and no two controller modules import each
other, so the engine can be driven by another dialect or in virtual time."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTROLLER = ROOT / "controller"
DIALECT_NEUTRAL = ["engine", "shape", "book", "payloads", "accounting", "p2p", "groups", "dialect", "release"]


def local_imports(path: Path) -> set[str]:
    """The controller modules `path` imports (relative imports, resolved to dotted names
    under controller/), type-checking-only imports included: they are still a cycle."""
    pkg = path.relative_to(CONTROLLER).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(pkg[: len(pkg) - (node.level - 1)])
            target = ".".join(base + ([node.module] if node.module else []))
            names = [target] if node.module else [".".join(base + [a.name]) for a in node.names]
            found.update(n for n in names if n)
    return found


def modules() -> dict[str, set[str]]:
    mods = {}
    for path in CONTROLLER.rglob("*.py"):
        if "_pb2" in path.name:
            continue
        name = ".".join(path.relative_to(CONTROLLER).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = local_imports(path)
    return mods


def test_the_engine_and_its_parts_import_no_dialect():
    mods = modules()
    for name in DIALECT_NEUTRAL:
        assert name in mods, name
        dialects = sorted(m for m in mods[name] if m.startswith("dialects"))
        assert not dialects, f"controller/{name}.py imports {dialects}"


def assert_acyclic(graph: dict[str, set[str]]) -> None:
    """Fails naming the first import cycle found in `graph` (module -> modules it imports)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph.get(m, ())):
            if dep not in graph:
                continue
            assert state.get(dep) != 1, "import cycle: " + " -> ".join(path + [m, dep])
            if dep not in state:
                visit(dep, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_no_import_cycle_among_controller_modules():
    assert_acyclic(modules())


# The tool's layers, bottom up, by folder: what each may import of the tool (besides itself).
LOWER_LAYERS = {
    "neuronabox/schedules": {"neuronabox.errors"},
    "topology": {"neuronabox.errors"},
    "delay_models": {"neuronabox.errors", "neuronabox.topology", "neuronabox.schedules"},
}


def absolute_imports(path: Path) -> set[str]:
    """The `neuronabox...` modules `path` imports by absolute name, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "neuronabox" or m.startswith("neuronabox.")}


def test_the_lower_layers_import_only_what_is_below_them():
    """Schedules and topology stand alone (the simulation and the tests use them without
    a controller); delay models see topology and the kind vocabulary, nothing else."""
    for folder, allowed in LOWER_LAYERS.items():
        own = "neuronabox." + Path(folder).name
        for path in (ROOT / folder).rglob("*.py"):
            extra = {m for m in absolute_imports(path)
                     if not m.startswith(own) and not any(m == a or m.startswith(a + ".") for a in allowed)}
            assert not extra, f"{path.relative_to(ROOT)} imports {sorted(extra)}"


# The whole tool: every module of every package, by its installed name.
PACKAGES = {"neuronabox": ROOT / "neuronabox", "neuronabox.controller": ROOT / "controller",
            "neuronabox.delay_models": ROOT / "delay_models", "neuronabox.topology": ROOT / "topology"}  # fmt: skip


def tool_modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "_pb2" in path.name or path.name == "__main__.py":
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((prefix, *parts)).removesuffix(".__init__")
            if prefix == "neuronabox" and parts[0] in ("controller", "delay_models", "topology"):
                continue  # not under neuronabox/ on disk
            found[name] = path
    return found


def tool_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The tool's modules `name` imports, at any depth (a function-level import counts):
    `from P import N` is module P.N where that is a module, else P."""
    is_package = path.name == "__init__.py"
    pkg = name if is_package else name.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.add(sub if sub in known else module)
    return {t for t in targets if t in known and t != name}


def test_no_import_cycle_anywhere_in_the_tool():
    known = tool_modules()
    assert_acyclic({name: tool_imports(name, path, known) for name, path in known.items()})


def test_nothing_imports_the_command_line():
    known = tool_modules()
    for name, path in known.items():
        if name == "neuronabox.cli" or name.startswith("neuronabox.cli."):
            continue
        cli = {m for m in tool_imports(name, path, known) if m == "neuronabox.cli" or m.startswith("neuronabox.cli.")}
        assert not cli, f"{path.relative_to(ROOT)} imports {sorted(cli)}"


def test_no_module_over_600_lines_and_no_class_over_300():
    for path in tool_modules().values():
        text = path.read_text()
        assert len(text.splitlines()) <= 600, f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                assert size <= 300, f"{path.relative_to(ROOT)}: class {node.name} is {size} lines"
