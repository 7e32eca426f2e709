"""The deployment.json of a fresh anvil, for processes that sign for a chain that no one runs.

Anvil's account 0 deploys StakeToken, NodeRegistry, ComputePool and WorkLedger in that order, so their addresses are
always these; the EIP-712 domain needs only the chain id and the ComputePool address, so nothing need answer at
`rpc_url` (tests/shardcast/test_shardcast_network.py, benchmarks/shardcast.py).
"""

from __future__ import annotations

import json
from pathlib import Path

ANVIL_DEPLOYMENT = {
    "chain_id": 31337,
    "rpc_url": "http://127.0.0.1:8545",
    "block": 0,
    "contracts": {
        "StakeToken": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
        "NodeRegistry": "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512",
        "ComputePool": "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0",
        "WorkLedger": "0xCf7Ed3AccA5a467e9e704C703E8D87F634fB0Fc9",
    },
}


def write_anvil_deployment(path: Path) -> Path:
    """`ANVIL_DEPLOYMENT` as JSON at `path`."""
    path.write_text(json.dumps(ANVIL_DEPLOYMENT))
    return path
