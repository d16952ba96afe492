"""How tcloud's SSH connection is set up for bulk data (the streamed upload): the same
ciphers paramiko offers by default, the AEAD ones first (and, from tcloud.transport.packet, the
size of one write to a channel).

Ciphers. paramiko's default order starts with aes128-ctr, which needs a MAC: with
hmac-sha2-256 every 32 KiB packet pays an HMAC (hmac.new per packet, about 2 s per GiB
on the bench machine) on top of the cipher. aes128-gcm@openssh.com and
aes256-gcm@openssh.com are AEAD: one AES-GCM call encrypts and authenticates a packet,
no MAC. `preferred_ciphers` only moves them to the front of the list the transport
already offers (disabled_algorithms and all): nothing is added, nothing weaker is
offered than before, and a server without them negotiates as it did.

Windows. The window and packet size a client sets (default_window_size,
default_max_packet_size) govern what the client receives; an upload is limited by what
the server grants (OpenSSH: a 2 MiB window, 32 KiB packets), so they are left as they are.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import paramiko

from tcloud.transport.packet import CHANNEL_WRITE

__all__ = ["AEAD_CIPHERS", "CHANNEL_WRITE", "preferred_ciphers", "transport", "tune"]

# AEAD ciphers, fastest first (AES-128 does fewer rounds than AES-256; both are strong).
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def preferred_ciphers(offered: Sequence[str]) -> tuple[str, ...]:
    """The ciphers offered, in the same order but the AEAD ones first."""
    first = [name for name in AEAD_CIPHERS if name in offered]
    return (*first, *(name for name in offered if name not in first))


def tune(transport: paramiko.Transport) -> paramiko.Transport:
    """Put the AEAD ciphers first on a transport that has not started its handshake."""
    options = transport.get_security_options()
    options.ciphers = preferred_ciphers(options.ciphers)
    return transport


def transport(sock: socket.socket | paramiko.Channel, **kwargs) -> paramiko.Transport:
    """A paramiko.Transport with tcloud's choices: SSHClient.connect's transport_factory."""
    return tune(paramiko.Transport(sock, **kwargs))
