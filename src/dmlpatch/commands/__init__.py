"""The ``dmlpatch`` command and its subcommands."""
