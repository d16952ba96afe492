"""How much one write to an SSH channel should carry: one packet's payload. Without
paramiko, so the upload stream (tcloud.transfer.upload_stream) can be written through the
connection master by a command that never loads the SSH stack.

paramiko sends at most the peer's maximum packet size less 64 bytes per channel packet
(Channel._wait_for_send_window); OpenSSH's session channels take 32 KiB packets.
Channel.sendall then slices what is left (`s = s[sent:]`): a 1 MiB bytes object costs
about 16 MiB of copies. One write of CHANNEL_WRITE bytes is one packet and no slicing.
"""

from __future__ import annotations

# What one channel packet carries to an OpenSSH server (its 32 KiB less paramiko's 64).
CHANNEL_WRITE = 32768 - 64
