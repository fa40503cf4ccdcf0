"""errors.py - the package's one exception class."""
from __future__ import annotations

import errno as _errno


class NwcError(OSError):
    """A failed nwc call: ``.errno`` is the positive errno (``errno.ENOENT`` for an unknown model
    or tensor, ``errno.EINVAL`` for a bad argument or shape, ...) and ``.message`` (also
    ``.strerror``) the daemon's one-line message, or the library's own.

    A subclass of OSError, so ``except OSError`` catches it too; ``str(e)`` is
    ``"[Errno 2] model 'x' not found"``.
    """

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(errno, message)
        self.message = message

    @property
    def name(self) -> str:
        """The errno's symbolic name ("ENOENT"), or its number as text."""
        return _errno.errorcode.get(self.errno, str(self.errno))
