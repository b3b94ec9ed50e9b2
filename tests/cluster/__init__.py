"""Packing on a cluster: fastload.ray on a real Ray cluster of two nodes on this machine."""
