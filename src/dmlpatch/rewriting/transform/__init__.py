"""The rewriter: the CUDA device sites of one module's source, found and rerouted.

A *site* is a place where a module hard-codes CUDA. Each one becomes a call into
``dmlpatch.runtime.sites`` through the module-level alias ``__dmlpatch__``, keeping the original
expression as the argument so the rewritten code still reads like the original::

    torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.device(__dmlpatch__.device('cuda') if __dmlpatch__.is_available() else 'cpu')

Site kinds:

- ``is_available`` / ``cuda_api``: ``torch.cuda.<f>(...)`` for ``f`` in
  ``runtime.CUDA_FUNCTIONS`` → ``__dmlpatch__.<f>(...)``.
- ``device_literal``: ``'cuda'``, ``'cuda:N'``, ``f'cuda:{i}'``, ``'cuda:%d' % i``,
  ``'cuda:' + str(i)``, ``'cuda:{}'.format(i)`` where the value names a device →
  ``__dmlpatch__.device(<expr>)``. A value names a device as an argument of ``torch.device``,
  at a device parameter of a torch callable, positional or keyword (``device_parameters``, the
  table derived from torch's own signatures: ``torch.Generator('cuda')``, ``torch.load(f,
  'cuda')``, ``x.to('cuda')``, ``nn.Linear(3, 4, True, 'cuda')``; there an integer literal is
  CUDA's ordinal too: ``x.to(0)``), a keyword argument whose
  name ends in ``device`` or is ``map_location``, the default of a parameter whose name ends
  in ``device``, the value assigned to a name or attribute ending in ``device``, and the
  ``default=`` of ``add_argument('--device', ...)``, and what a function whose name ends in
  ``device`` or ``device_name`` returns (``get_device()``, ``get_device_name()``). Branches
  of ``a if c else b`` and operands of ``a or b`` in those places count too.
  ``torch.device('cuda', i)`` becomes ``torch.device(__dmlpatch__.device(i))``. A device
  *type* (``torch.get_autocast_dtype('cuda')``) → ``__dmlpatch__.device_type(...)``, and a
  ``DataLoader``'s ``pin_memory_device`` → ``__dmlpatch__.pin_memory_device(...)``.
- ``device_argument``: any other value at a device parameter of a torch callable (a name, an
  attribute, a subscript, a call: ``x.to(dev)``, ``torch.randn(2, device=cfg['dev'])``,
  ``torch.load(f, where)``), or at a keyword named ``device``, ``map_location`` or
  ``pin_memory_device`` on any call → ``__dmlpatch__.device_argument(value)`` (or the
  ``map_location`` / ``device_type`` / ``pin_memory_device`` check of its kind), which answers
  CUDA's names and passes every other value through. Dtypes (``torch.float16``, ``x.dtype``),
  ``torch.device(...)`` calls (rewritten in themselves) and literals that are not CUDA's are
  left alone. In the program's own code (``rewrite(..., program=True)``: the main script and
  modules outside site-packages) these count alone: its devices may come from its command
  line, environment or configs. Elsewhere only beside another site or a CUDA literal kept in a
  name, a default or a dict (``dev = 'cuda'``), like ``device_value``.
- ``device_literal`` also: a CUDA literal chosen in ``a if c else b`` against another
  device's name or by CUDA's availability (``dev = 'cuda' if torch.cuda.is_available() else
  'cpu'``, ``train(model, 'cuda' if use_gpu else 'cpu')``), and one assigned in an ``if`` whose
  condition asks whether CUDA is available, whatever the names.
- ``device_value``: the computed argument of ``torch.device(x)`` (a name, an attribute, a
  call) → ``torch.device(__dmlpatch__.device(x))``, in a module with other sites: yolov5's
  ``select_device`` ends with ``arg = 'cuda:0'`` ... ``return torch.device(arg)``. Likewise a
  device read from outside the source where a device goes (``.to(args.device)``,
  ``device=cfg["device"]``, ``device = os.environ.get("DEVICE", "cuda")``, ``sys.argv[1]``):
  settings, the environment and the command line may say ``cuda``. Values that do not name
  CUDA pass unchanged; a module whose only sites these are is left as it is.
- ``cuda_test``: a test of a device against CUDA's name (``x.device.type == 'cuda'``,
  ``'cuda' in str(d)``, ``d.startswith('cuda')``, ``d.type in ('cuda', 'xpu')``, a dict keyed by
  ``'cuda'`` indexed by a device type, ``match``, ``x.is_cuda``): the compared value →
  ``__dmlpatch__.as_cuda(value)`` inside the test only (``x.is_cuda`` →
  ``__dmlpatch__.is_cuda(x)``), so it answers as on CUDA (``dmlpatch.runtime.device_tests``);
  in a module with other sites only (``device_tests``).
- ``cuda_call``: ``x.cuda(...)`` → ``__dmlpatch__.cuda(x, ...)``.
- ``pin_memory``: ``x.pin_memory(...)`` → ``__dmlpatch__.pin_memory(x, ...)``: page-locked host
  memory is CUDA's (torch 2.4 pins for CUDA whatever the device, and without a CUDA driver
  the call fails), so elsewhere a CPU tensor's copy is in ordinary memory.
- ``torch_load``: ``torch.load(f)`` without ``map_location`` → ``__dmlpatch__.load(torch.load,
  f)``, which maps the storages a CUDA machine saved (``cuda:N``) to the target, as CUDA would
  restore them there; in a module with other sites only, like ``device_value``.
- ``inference_mode``: ``torch.inference_mode`` → ``__dmlpatch__.inference_mode``, which is
  torch's except on DirectML, whose kernels refuse parameters inside it
  (``dmlpatch.runtime.inference``); with ``from torch import inference_mode``, its calls and
  its use as a bare decorator.
- ``cuda_api``: ``torch.Stream(...)`` / ``torch.Event(...)`` → ``__dmlpatch__.queue(torch.Stream,
  ...)``: DirectML has neither; on the adapter they are ``torch.cuda.Stream``'s answers.
- ``cuda_api``: ``torch.cuda.<name>`` for ``name`` in ``cuda_api.NAMES``
  (``get_device_properties``, memory statistics, ``Stream``, ``Event``, ``device``,
  ``FloatTensor``...), called or not → ``__dmlpatch__.torch_cuda.<name>``; ``from torch.cuda
  import <names>`` naming one of them imports from ``dmlpatch.runtime.cuda_api`` instead,
  which answers the other names with torch.cuda's.
- ``tensor_type``: in a module that names a legacy type (``torch.cuda.FloatTensor``), every
  ``x.type(T)`` call → ``__dmlpatch__.torch_cuda.retype(x, T)``: ``T`` is often a variable
  (``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``).
- ``accelerator``: ``torch.accelerator`` (torch >= 2.6's device-agnostic API, which
  torch-directml's torch 2.4.1 lacks) → ``__dmlpatch__.accelerator``
  (``dmlpatch.runtime.accelerator``); ``from torch import accelerator`` imports that module
  when it is the statement's only name.
- ``complex_literal``: arithmetic (``+ - * /``) between a complex literal and another value
  (``mag * (x + 1j * y)``, ``torch.exp(1j * phase)``), in a module that imports torch →
  ``__dmlpatch__.with_complex('*', 1j, y)``: DirectML has no complex type, so a real DirectML
  tensor meeting a complex number is made a complex tensor of dmlpatch's first
  (``dmlpatch.opfix.complex``); anything else is the plain operation.
- ``amp``: calls of ``torch.autocast``, ``torch.amp.autocast``, ``torch.cuda.amp.autocast``,
  ``torch.amp.GradScaler`` and ``torch.cuda.amp.GradScaler`` (or the same names imported) →
  ``__dmlpatch__.autocast(<callee>, ...)`` / ``__dmlpatch__.grad_scaler(<callee>, ...)``, the
  device's autocast and GradScaler (``dmlpatch.runtime.amp``); ``torch.cuda.amp.custom_fwd`` /
  ``custom_bwd`` (or the names imported), bare or called →
  ``__dmlpatch__.custom_amp(<name>)``, torch.amp's decorators for the device.

Other ``torch.cuda.<name>`` uses (``jiterator``, ``nccl``, the caching allocator...) are not
sites: they are *unanswered* (``Rewritten.unanswered``), because once a function's sites say CUDA
is available, code behind them would fail without a CUDA GPU; so are names imported from a
library that runs only on CUDA (``dmlpatch.runtime.cuda_only``: triton, xformers, mamba_ssm...).
So the sites of the function that uses one (and of the functions around it; the module's own
code where no function is) go to ``dmlpatch.runtime.as_written`` through ``__dmlpatch_kept__``
instead, keeping CUDA's meaning there (``Rewritten.kept``); the rest of the module is
rewritten. Names in ``runtime.HARMLESS_CUDA_NAMES`` behave the same with or without one and
are not listed; ``dmlpatch.rewriting.cuda_inventory`` classifies every public ``torch.cuda``
name.

Everything else that says ``cuda`` is left alone on purpose: dict keys and displays that are
not looked up by a device, messages, a module whose only CUDA words are tests (device-agnostic
code, whose CUDA branches are CUDA's own kernels and streams).

New nodes take the location of the expression they replace, so every original statement keeps
its line and column numbers and tracebacks point at the original source.

Layout: one walk (``walker``) with a class per site kind (``device_sites``, ``device_tests``,
``cuda_api_sites``, ``training_sites``, ``complex_sites``), the per-function rule
(``as_written``), composed in ``transformer``; ``names`` reads the module's imports and
``nodes`` builds what replaces a site.
"""

from __future__ import annotations

import ast
from typing import NamedTuple, Union

from dmlpatch.rewriting.transform.as_written import CUDA_API_MODULE
from dmlpatch.rewriting.transform.device_sites import holds_cuda_literal
from dmlpatch.rewriting.transform.names import ImportedNames
from dmlpatch.rewriting.transform.nodes import Lines, insert_runtime_import, uses_name
from dmlpatch.rewriting.transform.transformer import Transformer
from dmlpatch.rewriting.transform.walker import Site
from dmlpatch.runtime import ALIAS, AS_WRITTEN, KEPT_ALIAS, SITES

__all__ = ["RUNTIME_MODULE", "Rewritten", "Site", "find_sites", "rewrite"]

RUNTIME_MODULE = SITES
#: Site kinds rewritten only in a module with other sites, or one that hard-codes CUDA another
#: way (:func:`_hard_codes_cuda`).
_ONLY_BESIDE_CUDA = frozenset({"device_value", "device_argument", "torch_load", "cuda_test"})
#: Of those, the values known only at run time, which may say CUDA.
_RUN_TIME_VALUES = frozenset({"device_value", "device_argument", "torch_load"})


class Rewritten(NamedTuple):
    """The rewritten tree (the unchanged parse when there are no sites), its sites, the
    ``torch.cuda`` names it uses that the runtime does not answer (sorted, without repeats),
    and the functions that keep CUDA's meaning because they use them: ``(qualified name or
    '<module>', names)`` for each one that has sites."""

    tree: ast.Module
    sites: list[Site]
    unanswered: tuple[str, ...] = ()
    kept: tuple[tuple[str, tuple[str, ...]], ...] = ()


def find_sites(source: Union[str, bytes], filename: str = "<unknown>") -> list[Site]:
    """The CUDA device sites of ``source``, in source order; nothing is compiled."""
    return rewrite(source, filename).sites


def rewrite(
    source: Union[str, bytes],
    filename: str = "<unknown>",
    runtime: str = RUNTIME_MODULE,
    program: bool = False,
) -> Rewritten:
    """Parse ``source`` and reroute its CUDA device sites to ``runtime`` (imported as
    ``__dmlpatch__``); raises ``SyntaxError`` like compile.

    ``program``: the source is the program's own code (its main script, its modules outside
    site-packages), whose devices may come from its command line, environment or config
    files: its values at device parameters are sites even where it names no CUDA itself.
    """
    tree = ast.parse(source, filename)
    # Another runtime keeps CUDA's meaning: its modules import torch.cuda's names as written.
    answers = CUDA_API_MODULE if runtime == RUNTIME_MODULE else None
    transformer = Transformer(ImportedNames.of(tree), Lines(source), answers)
    transformer.transform(tree)
    sites = sorted(transformer.sites, key=lambda site: (site.line, site.col))
    if (
        sites
        and all(site.kind in _ONLY_BESIDE_CUDA for site in sites)
        and not _hard_codes_cuda(sites, tree, program)
    ):
        # torch.device(x), x.to(d) and torch.load(f) alone are device-agnostic code (scipy,
        # torchvision): only a module that hard-codes CUDA somewhere can hand x a CUDA value
        # of its own making, or expect f's tensors back on CUDA.
        return Rewritten(ast.parse(source, filename), [], tuple(sorted(transformer.unanswered)))
    kept: list[tuple[str, tuple[str, ...]]] = []
    if runtime == RUNTIME_MODULE:
        kept = transformer.keep_tainted(tree)
    if sites and (not kept or uses_name(tree, ALIAS)):
        insert_runtime_import(tree, runtime, ALIAS)
    if kept:
        insert_runtime_import(tree, AS_WRITTEN, KEPT_ALIAS)
    return Rewritten(tree, sites, tuple(sorted(transformer.unanswered)), tuple(kept))


def _hard_codes_cuda(sites: list[Site], tree: ast.Module, program: bool) -> bool:
    """Whether a module whose sites all take values known at run time may hand them CUDA's
    name: the program's own code (its settings may say ``cuda``), or a module that holds a
    CUDA literal outside any test (``dev = "cuda"`` ... ``x.to(dev)``). Tests of the device
    alone (``x.device.type == "cuda"``) are device-agnostic code."""
    if not any(site.kind in _RUN_TIME_VALUES for site in sites):
        return False
    return program or holds_cuda_literal(tree)
