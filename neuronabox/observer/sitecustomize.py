"""Loaded by every Python process the launcher starts (PYTHONPATH); starts the
observer only in real ranks (RANK is set) of a NeuronaBox run."""

import os

if os.environ.get("NEURONABOX_OBSERVER") and os.environ.get("RANK") is not None:
    try:
        from neuronabox.observer.agent import start

        start()
    except Exception as exc:  # the run goes on without it
        import sys

        print(f"neuronabox observer disabled: {exc}", file=sys.stderr)
