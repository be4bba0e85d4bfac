"""Calibration: activation statistics over a calibration set (issue 3)."""
