"""Recovery: plans (star, line, tree), the cost model that picks one, the executor that
fetches a manifest's chunks along a plan, and multi-failure drills.

Names are imported on first use: a peer process loads ``recovery.relay`` (its side of
line and tree recovery) without the executor and the client it drives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ring.exports import lazy_exports

if TYPE_CHECKING:
    from recovery.cost import Choice, Estimate, Network, Workload, choose, estimate
    from recovery.executor import RecoveryResult, locate, recover, recover_blob
    from recovery.plan import TOPOLOGIES, ChunkSpec, Plan, PlanNode, Topology, build_plan

# Public name -> the module that defines it.
_EXPORTS = {
    "TOPOLOGIES": "recovery.plan",
    "Choice": "recovery.cost",
    "ChunkSpec": "recovery.plan",
    "Estimate": "recovery.cost",
    "Network": "recovery.cost",
    "Plan": "recovery.plan",
    "PlanNode": "recovery.plan",
    "RecoveryResult": "recovery.executor",
    "Topology": "recovery.plan",
    "Workload": "recovery.cost",
    "build_plan": "recovery.plan",
    "choose": "recovery.cost",
    "estimate": "recovery.cost",
    "locate": "recovery.executor",
    "recover": "recovery.executor",
    "recover_blob": "recovery.executor",
}

__all__ = [
    "TOPOLOGIES",
    "Choice",
    "ChunkSpec",
    "Estimate",
    "Network",
    "Plan",
    "PlanNode",
    "RecoveryResult",
    "Topology",
    "Workload",
    "build_plan",
    "choose",
    "estimate",
    "locate",
    "recover",
    "recover_blob",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
