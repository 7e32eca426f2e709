"""The local devnet: a chain with the contracts on it, and scripted walks through the network's life."""
