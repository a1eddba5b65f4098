"""The basicsr patch: its spec and its function-level fixes."""
