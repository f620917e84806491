"""The one check the test scripts share (each runs as `python script.py`, so this folder
is on its path): a failed check prints one line naming the rank and leaves at once."""

import os
import sys


def expect(cond: bool, what: str) -> None:
    if not cond:
        print(f"rank {os.environ.get('RANK', '?')}: CHECK FAILED: {what}", flush=True)
        sys.stdout.flush()
        os._exit(1)  # without Gloo's teardown, which can abort (see collectives.py)


def passed() -> None:
    """The line the tests wait for, then out at once: stock torch 2.13 sometimes aborts in
    Gloo's destructors at interpreter teardown."""
    print("all checks passed", flush=True)
    sys.stdout.flush()
    os._exit(0)
