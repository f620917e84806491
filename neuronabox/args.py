"""The tool's argument parser: argparse with its errors in the tool's one line.

Every command (neuronabox/cli/) declares its parser with it; it lives here, below the
commands, so that no part of the tool has to import the command line to get it."""

from __future__ import annotations

import argparse
import sys


class ArgParser(argparse.ArgumentParser):
    """argparse, its errors in the tool's one line (exit status 2)."""

    def error(self, message: str):
        print(f"neuronabox: error: {message}", file=sys.stderr)
        sys.exit(2)
