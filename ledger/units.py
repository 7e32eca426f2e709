"""Token amounts: people type whole tokens ("12.5"), contracts count base units (12.5 x 10^decimals)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from ledger.errors import AmountError


def parse_amount(text: str | int | Decimal, decimals: int = 18) -> int:
    """'12.5' -> 12_500_000_000_000_000_000 for 18 decimals. Rejects negatives and excess precision."""
    try:
        value = Decimal(str(text).strip().replace("_", ""))
    except InvalidOperation as exc:
        raise AmountError(f"not a token amount: {text!r}") from exc
    if not value.is_finite() or value < 0:
        raise AmountError(f"token amount must be a non-negative number, got {text!r}")
    scaled = value.scaleb(decimals)
    if scaled != scaled.to_integral_value():
        raise AmountError(f"{text!r} has more than {decimals} decimal places")
    return int(scaled)


def format_amount(base_units: int, decimals: int = 18, places: int = 4) -> str:
    """12_500_000_000_000_000_000 -> '12.5'; shows at most `places` decimals, trimming zeros."""
    value = Decimal(base_units).scaleb(-decimals)
    text = f"{value:,.{places}f}".rstrip("0").rstrip(".")
    if text in ("0", "-0") and base_units != 0:
        return f"{'-' if base_units < 0 else ''}<{Decimal(1).scaleb(-places)}"
    return text
