"""The ultralytics patch: its spec and its function-level fixes."""
