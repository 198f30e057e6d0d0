"""Pool policies and quotas: how the placement loop orders and limits each pool's queue."""
