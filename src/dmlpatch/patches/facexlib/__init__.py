"""The facexlib patch: its spec and its function-level fixes."""
