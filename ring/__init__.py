"""The storage ring: placement, the chunk and record stores, and the peer process."""

from ring.placement import VNODES_DEFAULT, Member, Ring

__all__ = ["VNODES_DEFAULT", "Member", "Ring"]
