"""Samples stage: typed fields, file fields, collate, and the user's transforms."""
