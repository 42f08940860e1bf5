"""`device_facts.capability`: asked once per device, on any machine (a stand-in answers for the GPU)."""

from __future__ import annotations

import torch

from cs336_systems.attention import device_facts


def test_capability_is_asked_once_per_device(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or (9, 0))
    for _ in range(3):
        assert device_facts.capability(torch.device("cuda", 0)) == (9, 0)
    assert device_facts.capability(torch.device("cuda", 1)) == (9, 0)
    assert asked == [torch.device("cuda", 0), torch.device("cuda", 1)]


def test_another_stand_in_is_asked_afresh(monkeypatch):
    # tests swap the GPU they pretend to have; a cached answer from the last one would be wrong
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert device_facts.capability("cuda:0") == (9, 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert device_facts.capability("cuda:0") == (8, 0)
