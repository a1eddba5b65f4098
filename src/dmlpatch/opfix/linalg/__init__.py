"""Linear algebra: LU solves, inverses and determinants, QR, products."""
