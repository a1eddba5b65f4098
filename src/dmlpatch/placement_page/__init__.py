"""The placement report as an HTML page (``dmlpatch check --html DIR``, ``--report=FILE.html``)."""
