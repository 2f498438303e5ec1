"""Autotuning and calibration: run the search's best plans, measure them, correct the model."""
