"""Fidelity: the testbeds, the calibration probe, `calibrate` and `validate`."""
