"""Collective algorithms as pure functions of (kind, geometry, world, rank, root).

Written once and shared by the live engine, the simulation and the tests.
"""
