"""Function-level fixes named by patch specs (``fix = "dmlpatch.fixes.<module>:<function>"``).

Each fix has wrapt's signature ``(wrapped, instance, args, kwargs)``, one module per target
library, applied only while the target device needs it (see ``dmlpatch.engine``).
"""
