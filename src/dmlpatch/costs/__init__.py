"""What device work costs on DirectML: adapter profiles (shipped, or measured by ``dmlpatch
calibrate``), the simulated device's modelled time priced on them, and the per-call choice
between a fix's composition and DirectML's CPU fallback.

Modules: :mod:`~dmlpatch.costs.profiles` (the constants and their sources),
:mod:`~dmlpatch.costs.active` (which profile prices this process), :mod:`~dmlpatch.costs.machine`
(measured profiles in the cache), :mod:`~dmlpatch.costs.pricing` (counts to seconds by cause
and operator), :mod:`~dmlpatch.costs.simulated` (the simulated device's models and clock),
:mod:`~dmlpatch.costs.choice` (composition or fallback, per call). Importing this package
imports neither torch nor any of them.
"""
