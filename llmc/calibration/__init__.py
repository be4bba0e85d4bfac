"""Calibration: activation statistics over a calibration set."""
