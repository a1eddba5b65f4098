"""The safetensors patch: its spec and its function-level fixes."""
