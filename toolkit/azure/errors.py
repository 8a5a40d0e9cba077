"""The one error type of toolkit.azure: bad input or a missing piece, said in one line that names the field."""

from __future__ import annotations

from toolkit.errors import UserError


class AzureError(UserError, ValueError):
    """A plan or submit request that cannot be honoured; the message names the field, the value and what is
    allowed (the CLI prints it as ``error: ...`` and exits 2)."""
