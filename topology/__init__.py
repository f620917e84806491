"""The emulated cluster: nodes, ranks per node, link classes and switch tiers.

A topology is read from a preset name or a YAML file (`--topology NAME|FILE`).
It answers which links a message between two ranks crosses; delay models turn
that path into time.
"""

from __future__ import annotations

from .model import HostWork, LinkClass, Topology, TopologyError
from .presets import PRESETS, as_spec, from_dict, load

__all__ = ["HostWork", "LinkClass", "Topology", "TopologyError", "PRESETS", "as_spec", "from_dict", "load"]
