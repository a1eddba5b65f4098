"""What rewritten code calls: ``sites`` (imported by every rewritten module as ``__dmlpatch__``)
and the CUDA API it answers (``cuda_device``, ``cuda_api``, ``accelerator``, ``amp``,
``inference``); ``as_written`` for the functions that keep CUDA's meaning. The rewriter
(``dmlpatch.rewriting``) reads these modules' name lists; nothing here imports the rewriter.

The names below are how rewritten code reaches the runtime: the rewriter writes them into
modules, and the import hook, discovery, start-up and the missed-site check look for them. They
are spelled here only, as plain strings, so that the import hook reads them at start-up without
loading the runtime."""

#: This package: ``from torch import accelerator`` is rewritten to import it from here.
PACKAGE = __name__
#: The module every rewritten module imports, and the name it is imported as.
SITES = "dmlpatch.runtime.sites"
ALIAS = "__dmlpatch__"
#: The same for the functions that keep CUDA's meaning (see ``dmlpatch.rewriting.transform``).
AS_WRITTEN = "dmlpatch.runtime.as_written"
KEPT_ALIAS = "__dmlpatch_kept__"
#: Where ``from torch.cuda import X`` is rewritten to import from.
CUDA_API = "dmlpatch.runtime.cuda_api"
