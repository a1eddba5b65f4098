"""Pin protection: pip keeps torch-directml's torch in every later install of this environment."""
