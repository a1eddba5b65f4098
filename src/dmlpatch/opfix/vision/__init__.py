"""Vision: torchvision's detection operators, grid sampling, pooling, sliding blocks."""
