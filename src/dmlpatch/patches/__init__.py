"""The built-in patches: one folder per target library, holding its spec (``spec.toml``) and the
function-level fixes it names (``fix = "dmlpatch.patches.<library>.<module>:<function>"``).

Each fix has wrapt's signature ``(wrapped, instance, args, kwargs)`` and is applied only while
the target device needs it (see ``dmlpatch.specs.engine``).
"""
