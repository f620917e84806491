"""The optimizer-step clock: when a rank's optimizer steps, the boundary of its iterations
in any unmodified script (torch.optim's global step post-hook, which every optimizer runs).

`sitecustomize` starts `log_steps` in every real rank when NEURONABOX_STEP_LOG names a
folder: `neuronabox validate` sets it for its all-real and its emulated runs alike, so both
are timed by one clock under one definition. The observer reports the same steps to the
controller through `on_step`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

STEP_LOG = "NEURONABOX_STEP_LOG"  # a folder: each rank appends its step times to rank<R>.steps
POLL_S = 0.05  # how often the hook thread looks for the script's import of torch.optim


def step_file(folder: str | os.PathLike, rank: int | str) -> Path:
    return Path(folder) / f"rank{rank}.steps"


def on_step(callback: Callable[[], None]) -> None:
    """Call `callback()` after every optimizer step of this process, once the script has
    imported torch.optim itself: importing it from this thread could deadlock with the main
    thread's own import, so a thread waits for it."""

    def register() -> None:
        while True:
            mod = sys.modules.get("torch.optim.optimizer")
            hook = getattr(mod, "register_optimizer_step_post_hook", None)
            if hook is not None and getattr(sys.modules.get("torch.optim"), "SGD", None) is not None:
                hook(lambda *_: callback())
                return
            time.sleep(POLL_S)

    threading.Thread(target=register, name="neuronabox-steps", daemon=True).start()


def log_steps(folder: str, rank: str) -> None:
    """Append each optimizer step's monotonic time (seconds) to the rank's file, one line
    per step in one write, so a rank killed mid-run leaves whole lines."""
    fd = os.open(step_file(folder, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    on_step(lambda: os.write(fd, f"{time.perf_counter():.6f}\n".encode()))
