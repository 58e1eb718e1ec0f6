"""The exceptions of mscclpp_rs: one class per kind of failure, each carrying the library's text.

Every error of the Rust library reaches Python as an instance of one of these classes. Its
message is the library's error and its causes on one line, and ``variant`` names the Rust
error variant (``"CountMismatch"``, ``"BootstrapTimeout"``, …; empty for errors the Python
package found itself), so a program can tell cases apart without parsing text:

>>> from mscclpp_rs import errors
>>> e = errors.CountMismatchError("rank 1 sent 64 bytes, 32 were expected", "CountMismatch")
>>> isinstance(e, errors.InvalidUsageError), isinstance(e, errors.MscclppError)
(True, True)
>>> e.variant
'CountMismatch'
>>> issubclass(errors.CommTimeoutError, TimeoutError)
True

=======================  =========================================================  ==============
class                    raised for                                                 also a
=======================  =========================================================  ==============
``CommTimeoutError``     a wait that ran out of time: bootstrap, set-up, a device   ``TimeoutError``
                         wait's spin limit, a flush
``RemoteError``          a peer that died or closed its links                       ``ConnectionError``
``AbortedError``         a communicator aborted (by ``abort()``, a failed proxy)
``InvalidArgumentError`` an argument the library cannot take (a rank out of range,  ``ValueError``
                         a buffer too small, an unknown name)
``InvalidUsageError``    calls that do not fit together (settings that differ
                         between ranks, a full registry)
``CountMismatchError``   a receive whose count differs from its send (an
                         ``InvalidUsageError``)
``UnsupportedError``     what this build, backend or world cannot do
``BootstrapError``       a bootstrap connection refused, malformed or unauthenticated ``ConnectionError``
``DeviceError``          the CUDA driver or the device runtime failed
``MscclppError``         the base class; anything else
=======================  =========================================================  ==============
"""

from __future__ import annotations

__all__ = [
    "AbortedError",
    "BootstrapError",
    "CommTimeoutError",
    "CountMismatchError",
    "DeviceError",
    "InvalidArgumentError",
    "InvalidUsageError",
    "MscclppError",
    "RemoteError",
    "UnsupportedError",
]


class MscclppError(Exception):
    """An error of mscclpp-rs. ``str(e)`` is the library's text; ``variant`` the Rust variant."""

    def __init__(self, message: str, variant: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.variant = variant


class CommTimeoutError(MscclppError, TimeoutError):
    """A wait ran out of time (bootstrap, set-up exchange, a device wait's spin limit, a flush)."""


class RemoteError(MscclppError, ConnectionError):
    """A peer died or closed its links."""


class AbortedError(MscclppError):
    """The communicator was aborted (``Communicator.abort``, a failed proxy, a dead peer seen)."""


class InvalidArgumentError(MscclppError, ValueError):
    """An argument the library cannot take."""


class InvalidUsageError(MscclppError):
    """Calls that do not fit together (different settings on different ranks, a full registry)."""


class CountMismatchError(InvalidUsageError):
    """A receive whose count differs from what its peer sent. Nothing was written; the
    communicator's later calls raise it too until ``Communicator.reset_status()``."""


class UnsupportedError(MscclppError):
    """What this build, backend or world cannot do."""


class BootstrapError(MscclppError, ConnectionError):
    """A bootstrap connection that was refused, malformed or failed to authenticate."""


class DeviceError(MscclppError):
    """The CUDA driver or the device runtime failed (allocation, copy, launch, module load)."""
