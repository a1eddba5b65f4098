"""Where library patches are applied: patch specs read, matched to installed versions (the
cached plan), and installed as rewrite targets, function wrappers and module aliases."""
