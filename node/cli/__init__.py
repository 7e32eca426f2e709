"""Command-line entry points: `prime-node` (main.py) and its command groups, one file each."""
