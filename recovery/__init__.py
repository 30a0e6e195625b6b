"""Recovery plans (star, line, tree), their cost model, executors and drills.

Not built yet: the recovery topologies arrive with a later capability.
"""

__all__: list[str] = []
