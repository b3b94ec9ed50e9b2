"""Loading stage: the DataLoader, its iterator, settings, prefetch, pinned transfer, batch memory, stats."""
