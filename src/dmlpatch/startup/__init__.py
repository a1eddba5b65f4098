"""Where a process starts patched: the runner, ``dmlpatch activate``'s ``.pth`` and its
bootstrap, and the ``sitecustomize`` that children of a patched process start with."""
