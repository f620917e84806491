"""The `neuronabox` command: one module per command in this package, each declaring its
parser (`build_parser`), its one-line summary and its `main`. The top-level help is made
from them; nothing outside this package imports it."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

# The commands, in the order the help lists them: name -> module.
COMMANDS = {
    "torchrun": "neuronabox.cli.torchrun",
    "controller": "neuronabox.cli.controller",
    "simulate": "neuronabox.cli.simulate",
    "whatif": "neuronabox.cli.whatif",
    "perf": "neuronabox.cli.perf",
    "export": "neuronabox.cli.export",
    "report": "neuronabox.cli.report",
    "calibrate": "neuronabox.cli.calibrate",
    "validate": "neuronabox.cli.validate",
    "status": "neuronabox.cli.status",
    "inject": "neuronabox.cli.inject",
    "topology": "neuronabox.cli.topology",
}


def command(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: neuronabox COMMAND [ARGS]   (neuronabox COMMAND --help for a command's flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {command(name).SUMMARY}" for name in COMMANDS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"neuronabox: error: unknown command {name!r}\n{usage()}", file=sys.stderr)
        return 2
    return command(name).main(rest)


if __name__ == "__main__":
    sys.exit(main())
