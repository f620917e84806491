"""docs/reference.md, made from the commands' own parsers, so it cannot fall behind a flag:

    python -m neuronabox.cli.reference > docs/reference.md

(tests/test_cli_input.py checks the file against this)."""

from __future__ import annotations

import os
import sys

from neuronabox.cli import COMMANDS, command, usage

WIDTH = "100"  # argparse wraps help at the terminal's width: fixed, so the file is the same everywhere


def reference() -> str:
    """Every command's `--help`, in the order `neuronabox --help` lists them."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        out = ["# Reference: every command and flag", "",
               "Made from the commands' own parsers (`python -m neuronabox.cli.reference > docs/reference.md`); "
               "each section is what `neuronabox COMMAND --help` prints.", "", "```", usage(), "```", ""]  # fmt: skip
        for name in COMMANDS:
            text = command(name).build_parser().format_help().rstrip()
            out += [f"## `neuronabox {name}`", "", "```", text, "```", ""]
        return "\n".join(out)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


if __name__ == "__main__":
    sys.stdout.write(reference())
