"""CUDA graphs on DirectML: a clear error where a graph would be captured (nothing replays a
captured graph there), and graphed callables run eagerly as themselves."""

from __future__ import annotations

from typing import Any

from dmlpatch.runtime.cuda_target import TorchsOffTarget as _TorchsOffTarget
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda


def _no_graphs(name: str) -> RuntimeError:
    return RuntimeError(
        f"torch.cuda.{name}: CUDA graphs have no DirectML counterpart (nothing replays a "
        "captured graph there); run the program without CUDA graphs, or on a CUDA GPU"
    )


class CUDAGraph(metaclass=_TorchsOffTarget):
    """``torch.cuda.CUDAGraph()``: a clear error on DirectML."""

    @classmethod
    def on_target(cls, *args: Any, **kwargs: Any) -> Any:
        raise _no_graphs("CUDAGraph")


class graph(metaclass=_TorchsOffTarget):
    """``with torch.cuda.graph(g):``: a clear error on DirectML."""

    @classmethod
    def on_target(cls, *args: Any, **kwargs: Any) -> Any:
        raise _no_graphs("graph")


def graph_pool_handle() -> Any:
    """A clear error on DirectML."""
    if _target() is None:
        return _cuda("graph_pool_handle")()
    raise _no_graphs("graph_pool_handle")


def make_graphed_callables(callables: Any, *args: Any, **kwargs: Any) -> Any:
    """The callables themselves: a graphed callable computes what it computes eagerly, and
    DirectML runs it eagerly."""
    if _target() is None:
        return _cuda("make_graphed_callables")(callables, *args, **kwargs)
    return callables
