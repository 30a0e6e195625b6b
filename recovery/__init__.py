"""Recovery: plans (star, line, tree), the cost model that picks one, the executor that
fetches a manifest's chunks along a plan, and multi-failure drills."""

from recovery.cost import Choice, Estimate, Network, Workload, choose, estimate
from recovery.executor import RecoveryResult, locate, recover, recover_blob
from recovery.plan import TOPOLOGIES, ChunkSpec, Plan, PlanNode, Topology, build_plan

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
