"""NeuronaBox: run a few real ranks of a distributed PyTorch job inside a much larger emulated world."""

__version__ = "0.1.0"
