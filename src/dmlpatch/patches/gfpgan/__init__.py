"""The gfpgan patch: its spec and its function-level fixes."""
