"""Complex numbers on DirectML, held as pairs of reals (see :mod:`.tensor`)."""
