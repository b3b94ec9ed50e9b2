"""Decode stage: record bytes to pixels or values, crop plans, and the native JPEG/resample code."""
