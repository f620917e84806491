"""Rules the tool's code keeps everywhere, checked by walking the code (the live checks
of the same rules, on running processes, are in test_listeners.py and test_bounds.py):

- every whole-file read is bounded (`limits.read_bounded`, `read_tail`, a sized read,
  or the trace's line reader): a file a user names may be a device or a log that grew;
- nothing writes under a predictable temporary path: a run's files go to a folder
  `mkdtemp` made (mode 0700), and the runs registry checks who owns its folder;
- no socket is bound to every interface: listeners take an address (loopback unless
  the user names another).
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = ("neuronabox", "controller", "delay_models", "topology")
WHOLE_FILE_READS = {"read_text", "read_bytes", "readlines"}
UNSIZED_READS = {"read", "readline"}  # without a size argument


def tool_sources() -> list[Path]:
    files = []
    for pkg in PACKAGES:
        files += [p for p in (ROOT / pkg).rglob("*.py") if not p.name.endswith("_pb2.py") and "_pb2_grpc" not in p.name]
    return sorted(files)


def calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            yield name, node


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:100]}"


def test_every_whole_file_read_is_bounded():
    found = []
    for path in tool_sources():
        for name, node in calls(path):
            sized = bool(node.args or node.keywords)
            is_json_load = isinstance(node.func, ast.Attribute) and ast.unparse(node.func) == "json.load"
            if name in WHOLE_FILE_READS or (name in UNSIZED_READS and not sized) or is_json_load:
                found.append(where(path, node))
    assert not found, "unbounded reads (use neuronabox.limits.read_bounded or read_tail):\n" + "\n".join(found)


def test_nothing_writes_under_a_predictable_temporary_path():
    found = []
    for path in tool_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/tmp"):
                found.append(where(path, node))
            elif isinstance(node, ast.Attribute) and node.attr in ("mktemp", "gettempdir"):
                if not (path.name == "registry.py" and node.attr == "gettempdir"):  # it checks the folder's owner
                    found.append(where(path, node))
    assert not found, "predictable temporary paths (use tempfile.mkdtemp):\n" + "\n".join(found)


def test_no_socket_is_bound_to_every_interface():
    found = []
    for path in tool_sources():
        for name, node in calls(path):
            if name not in ("bind", "create_server", "listener", "store_listener"):
                continue
            for arg in ast.walk(node):
                if isinstance(arg, ast.Constant) and arg.value in ("", "0.0.0.0", "::"):
                    found.append(where(path, node))
    assert not found, "listeners on every interface:\n" + "\n".join(found)


def test_the_walk_sees_the_code_it_checks():
    """The rules above are only as good as the walk: it reaches the launcher, the
    controller, the trace readers and the lower layers."""
    names = {p.relative_to(ROOT).as_posix() for p in tool_sources()}
    for must in ("neuronabox/launcher/run.py", "controller/main.py", "neuronabox/trace/records.py",
                 "topology/presets.py", "delay_models/whatif.py"):  # fmt: skip
        assert must in names
