"""GlooHandoff in one process (world size 1): the network devices it asks gloo for, and its
bookkeeping of what it handed to gloo. The two-rank behaviour is in test_multi_adapter.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dmlpatch.patches.torch.gloo_handoff import GlooHandoff


def _handoff() -> GlooHandoff:
    return GlooHandoff(dist.HashStore(), 0, 1, timedelta(seconds=30))


def test_gloo_socket_ifname_is_honoured_as_torch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuchif0")
    with pytest.raises(RuntimeError, match="Unable to find address for: nosuchif0"):
        _handoff()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    handoff = _handoff()
    tensor = torch.ones(3)
    work = handoff.start("allreduce", [tensor])
    work.wait()
    handoff.settle(work)
    handoff.close()
    assert tensor.tolist() == [1.0, 1.0, 1.0]


def test_what_was_handed_is_kept_until_a_later_work_completes() -> None:
    handoff = _handoff()
    first, second = torch.ones(2), torch.ones(2)
    work1 = handoff.start("allreduce", [first])
    work2 = handoff.start("allreduce", [second])
    work2.wait()
    handoff.settle(work2)
    # work1 is let go (work2 completing proves gloo's one worker is done with it); work2 is
    # kept until a later one completes, or the handoff closes.
    assert [entry[0] for entry in handoff._handed] == [work2]
    handoff.settle(work1)  # already let go: nothing else goes with it
    assert [entry[0] for entry in handoff._handed] == [work2]
    handoff.close()
    assert list(handoff._handed) == []
    with pytest.raises(RuntimeError, match="this process group has been shut down"):
        handoff.start("allreduce", [first])
    handoff.close()  # twice is once


def test_a_bucket_future_completes_with_the_device_copy() -> None:
    handoff = _handoff()
    host, device_tensor = torch.full((4,), 2.0), torch.zeros(4)
    work = handoff.start("allreduce", [host])
    assert handoff.then_copy(work, host, device_tensor).wait() is device_tensor
    assert device_tensor.tolist() == [2.0] * 4
    handoff.close()
