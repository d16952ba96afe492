"""The protocol's name and version, and its two errors: an argument a request cannot
carry (BadArgument, before anything is sent) and an answer that does not fit its verb's
type (ProtocolError, naming the verb and the key).

PROTOCOL_VERSION changes when a verb or an answer changes in a way the other side must
know about (2: `session`; 3: `job target`, `attach`, `stop-on-disconnect`, `top`; 4:
`usage`; 5: `job connect`); tcloud reads the hello of each session and refuses to go on
when the two sides differ (tcloud.transport.agent.handshake)."""

from __future__ import annotations

from tacc_contract.errors import EXIT_CLUSTER, EXIT_USAGE, TaccError

PROTOCOL_VERSION = 5
AGENT = "tacc-agent"


class ProtocolError(TaccError):
    """An answer that does not have the shape this side of the protocol expects."""

    exit_code = EXIT_CLUSTER

    def __init__(self, verb: str, problem: str) -> None:
        super().__init__(
            f"the answer of `{AGENT} {verb}` does not fit protocol {PROTOCOL_VERSION}: "
            f"{problem} (are tcloud and the cluster's tacc-agent the same version?)"
        )
        self.verb = verb
        self.problem = problem


class BadArgument(TaccError, ValueError):
    """A verb's argument that the protocol cannot carry (a job id that is not one)."""

    exit_code = EXIT_USAGE
