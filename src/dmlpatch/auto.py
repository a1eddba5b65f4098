"""``import dmlpatch.auto`` as the first line of a script patches that process.

The device comes from ``$DMLPATCH_DEVICE`` (default ``auto``), the scope from
``$DMLPATCH_SCOPE``, and ``$DMLPATCH_REPORT`` names a report to write at exit. Modules imported
afterwards are rewritten; the script itself is run again from the top, rewritten, when it has
CUDA sites and nothing before this import did anything (see ``dmlpatch.startup.main_script``).
"""

from dmlpatch.startup import bootstrap, main_script

if bootstrap.startup(main=False):
    main_script.take_over_from_auto()
