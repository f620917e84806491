"""Simulation: the recorded program replayed in virtual time, and sweeps."""
