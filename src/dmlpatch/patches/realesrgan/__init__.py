"""The realesrgan patch: its spec and its function-level fixes."""
