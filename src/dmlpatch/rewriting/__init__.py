"""Where code is rewritten: CUDA device sites found in source and rerouted at import time, the
import hook that does it, discovery of which modules it covers, and what rewritten code calls."""
