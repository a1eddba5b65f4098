"""What rewritten code calls: ``sites`` (imported by every rewritten module as ``__dmlpatch__``)
and the CUDA API it answers (``cuda_device``, ``cuda_api``, ``accelerator``, ``amp``,
``inference``); ``as_written`` for the functions that keep CUDA's meaning. The rewriter
(``dmlpatch.rewriting``) reads these modules' name lists; nothing here imports the rewriter."""
