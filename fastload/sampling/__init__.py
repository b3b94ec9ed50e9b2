"""Sampling stage: epoch order from (seed, epoch), rank and worker shares, resume."""
