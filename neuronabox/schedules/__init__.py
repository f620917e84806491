"""Collective algorithms as pure functions of (kind, geometry, world, rank, root).

Written once and shared by the live engine, the simulation and the tests.
"""

# Every kind an instance record names: the collectives' schedules, and the two sides of
# a point-to-point message.
COLLECTIVE_KINDS = ("allreduce", "allgather", "broadcast", "barrier", "reduce", "gather", "scatter", "alltoall")
KINDS = (*COLLECTIVE_KINDS, "send", "recv")
