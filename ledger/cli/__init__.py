"""The `prime-pool` command (pool.py) and the plumbing every prime CLI shares (common.py)."""
