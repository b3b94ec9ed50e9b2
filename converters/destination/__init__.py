"""Where a pack goes: the output folder's rules, and upload to an object store under a lease."""
