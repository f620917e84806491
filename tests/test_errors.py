"""One error root: every error class the tool defines derives from NeuronaBoxError,
so one `except` catches what NeuronaBox itself refuses."""

import importlib
import inspect
import pkgutil

import neuronabox.controller
import neuronabox.delay_models
import neuronabox.topology

import neuronabox
from neuronabox.errors import NeuronaBoxError

SKIP = {"neuronabox.observer.sitecustomize", "neuronabox.cli.__main__"}  # run at start-up, not imported


def test_every_error_class_derives_from_the_root():
    seen = []
    packages = (neuronabox, neuronabox.controller, neuronabox.delay_models, neuronabox.topology)
    modules = [m for p in packages for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")]
    for mod in modules:
        if mod.name in SKIP or "control_pb2" in mod.name:
            continue
        module = importlib.import_module(mod.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == mod.name and issubclass(cls, Exception):
                seen.append(name)
                assert issubclass(cls, NeuronaBoxError), f"{mod.name}.{name} is not a NeuronaBoxError"
    assert {"WireError", "ProtocolError", "LaunchError", "TopologyError", "UsageError"} <= set(seen), sorted(seen)
