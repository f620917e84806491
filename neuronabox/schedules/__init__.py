"""Collective algorithms as pure functions of (kind, geometry, world, rank, root).

Written once and shared by the live engine, the simulation and the tests.
"""

from .kinds import COLLECTIVE_KINDS, GLOO_COLLECTIVES, GLOO_KINDS, KINDS, Kind

__all__ = ["COLLECTIVE_KINDS", "GLOO_COLLECTIVES", "GLOO_KINDS", "KINDS", "Kind"]
