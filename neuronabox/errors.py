"""The root of the errors NeuronaBox reports as its own.

A leaf module (it imports nothing), so every layer, the topology included, can
derive from it: one `except NeuronaBoxError` catches what the tool itself
refuses, and each subclass names the part that failed and its cause in one line.
"""


class NeuronaBoxError(Exception):
    """An error whose message is a one-line cause for the user."""
