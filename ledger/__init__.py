"""Client for the prime-node contracts: accounts, deployment, pool and work ledger calls."""
