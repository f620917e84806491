"""NeuronaBox: run a few real ranks of a distributed PyTorch job inside a much larger emulated world."""

__version__ = "0.1.0"
__all__ = ["KindStats", "RunResult", "launch"]


def __getattr__(name: str):
    """`neuronabox.launch` and its result types, imported on first use: the observer,
    which runs inside the user's ranks, imports this package too and needs none of it."""
    if name in __all__:
        from neuronabox.launcher import api

        return getattr(api, name)
    raise AttributeError(f"module 'neuronabox' has no attribute {name!r}")
