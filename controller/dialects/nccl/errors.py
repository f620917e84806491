"""The NCCL dialect's errors: one root, each message a one-line cause."""

from __future__ import annotations

from neuronabox.errors import NeuronaBoxError

from ...outcomes import ProtocolError


class NcclError(NeuronaBoxError):
    """Something the NCCL dialect refuses; the message names what and why."""


class UnsupportedNcclVersion(NcclError, ValueError):
    """An NCCL release whose layouts this controller has not read."""


class LayoutMismatch(NcclError):
    """R's own slice does not look like the layout chosen for its version: refuse before lying to R."""


class NcclWireError(NcclError, ProtocolError):
    """Bytes from R that break the NCCL wire protocol (size, handshake, order)."""
