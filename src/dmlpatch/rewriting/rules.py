"""The rewriter's rules as the rest of dmlpatch knows them, without loading the rewriter.

``GENERATION`` names the version of the rules (``dmlpatch.rewriting.transform``): every cache of
what the rules made carries it (rewritten bytecode, discovery's verdicts), so none outlives the
rules. :func:`may_have_sites` tells from a source's bytes alone, without parsing it, that it
has no site at all, which is the answer for most modules: the rewriter costs milliseconds to
load and each parse more. Both live here, apart from the import hook, so the caches and
discovery can ask without importing the hook, and the hook without importing them.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Optional

#: The version of the rewriter's rules (``dmlpatch.rewriting.transform``), bumped whenever the same
#: source is rewritten differently. Cached rewrites and discovery's cached verdicts both carry
#: it, so neither outlives the rules that made it (2: ``torch.inference_mode`` sites; 3: the
#: CUDA API, legacy types and AMP; 4: what functions named for a device return; 5: only
#: functions whose names end in device or device_name; 6: CUDA chosen against another device
#: or by its availability, whatever the name, and torch.load without map_location; 7: per
#: function "first do no harm", the RNG family, nvtx, CUDA graphs, and CUDA literals listed
#: under "if torch.cuda.is_available():"; 8: complex literals in arithmetic; 9: not when both
#: sides are numbers; 10: rewritten code imports ``dmlpatch.runtime``, the runtime's package;
#: 11: ``x.pin_memory()``; 13: tests of the device against CUDA's name, devices read from
#: settings, the environment or the command line, and CUDA-only libraries keep CUDA's meaning;
#: 14: every device parameter of torch's callables, positional or keyword, whatever value it
#: holds, and the program's own code; 15: torch.cuda.amp's custom_fwd / custom_bwd).
GENERATION = 15

#: A site's text holds one of these (``torch.amp.autocast('cuda')`` holds two).
SITE_WORDS = (
    b"cuda",
    b"inference_mode",
    b"autocast",
    b"GradScaler",
    b"accelerator",
    b"pin_memory",
)


#: What the program's own code holds where it passes a device it read at run time
#: (``x.to(args.device)``, ``torch.load(f, cfg.map_location)``).
PROGRAM_WORDS = (b"device", b"map_location")


def may_have_sites(source: bytes, program: bool = False) -> bool:
    """Whether ``source`` can hold a site at all (``dmlpatch.rewriting.transform``), told without
    parsing it: a source that says none of :data:`SITE_WORDS` (``cuda``, ``inference_mode``,
    ``autocast``, ``GradScaler``, ``accelerator``, ``pin_memory``), nor both ``torch`` and a
    complex literal, has none. The program's own code (``program``) also has sites where it
    passes on a device read at run time: :data:`PROGRAM_WORDS`."""
    if any(word in source for word in SITE_WORDS):
        return True
    if program and any(word in source for word in PROGRAM_WORDS):
        return True
    return b"torch" in source and _has_complex_literal(source)


_complex_literal: Optional[re.Pattern[bytes]] = None


def _has_complex_literal(source: bytes) -> bool:
    """Whether ``source`` has what looks like a complex literal (``1j``, ``2.5j``, ``.5J``):
    the parser decides. ``re`` is imported on the first module that needs it, not at start-up."""
    global _complex_literal
    if _complex_literal is None:
        import re

        _complex_literal = re.compile(rb"(?<![\w.])(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[jJ]\b")
    return _complex_literal.search(source) is not None
