"""The node name wins over the pod's hostname; an override wins over both; blank values are ignored."""

from __future__ import annotations

import socket

import pytest

from phasescope.identity import host_name


def test_node_name_before_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHASESCOPE_HOST", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert host_name() == socket.gethostname()
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    assert host_name() == "gpu-node-17"
    monkeypatch.setenv("PHASESCOPE_HOST", "rack4-u12")
    assert host_name() == "rack4-u12"
    monkeypatch.setenv("PHASESCOPE_HOST", "  ")
    assert host_name() == "gpu-node-17"
