"""How this machine names itself in every output: the Kubernetes node before the hostname.

In a DaemonSet the hostname is the pod's name, which changes on every rollout, so alerts, the dcgm-compat
`Hostname` and recordings would follow the pod instead of the machine. The downward API's `NODE_NAME`
(`spec.nodeName`, set in deploy/kubernetes/base/agent-daemonset.yaml) names the node and survives rollouts;
`PHASESCOPE_HOST` overrides both (a bare-metal fleet with its own naming).
"""

from __future__ import annotations

import os
import socket

ENV_VARS: tuple[str, ...] = ("PHASESCOPE_HOST", "NODE_NAME")


def host_name() -> str:
    """The first of `ENV_VARS` that is set and not blank, else the hostname."""
    for var in ENV_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            return value
    return socket.gethostname()
