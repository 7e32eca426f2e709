"""What every prime package may import and that has no role in it: errors, parsing and formatting, logging set-up.

Imports point one way: core <- ledger <- node <- validator, trainer. `core` imports nothing from those packages,
nor typer or rich: the command-line kit on top of it is `ledger.cli.common`.

- `errors`: `CoreError` and its leaves, and how an exception reads on one line;
- `timefmt`: chain timestamps and durations, printed and parsed;
- `hexids`: 0x-addresses and 32-byte values as people type them;
- `logs`: logging for one-shot commands and for daemons, and the PRIME_DEBUG switch;
- `config`: declared settings (TOML key, type, default, bounds, doc, flag), read from TOML, environment, flags;
- `exhaustion`: which of the host's resources (memory, disk, descriptors) an exception says ran out.
"""
