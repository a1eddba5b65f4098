"""The rewriter: CUDA device sites found in source and rerouted at import time (``transform``),
the import hook that does it (``hook``), which modules it covers (``discovery``, ``scope``) and
the caches of its work. What rewritten code calls is ``dmlpatch.runtime``."""
