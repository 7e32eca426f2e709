"""The worker daemon (`prime-node start`): the loop of DESIGN section 1 on one node, restart-safe."""
