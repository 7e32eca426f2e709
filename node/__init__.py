"""What every prime-node runs: keys and signing, config, p2p, relay, inference, proofs, CLIs."""
