"""Replica groups: several ``serve`` processes sharing one configuration's streams through
leases kept in the state store (:mod:`~deltastream.daemon.replicas.coordinator`)."""

from deltastream.daemon.replicas.coordinator import Coordinator, GroupSettings
from deltastream.daemon.replicas.records import shard_of

__all__ = ["Coordinator", "GroupSettings", "shard_of"]
