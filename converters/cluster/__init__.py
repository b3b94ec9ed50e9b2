"""Cluster packing: a Ray Data sink whose write tasks are writers of whole shards, and the driver's finalize."""
