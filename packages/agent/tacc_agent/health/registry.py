"""How a health check is declared, in node_exporter's collector model: one signature
(`run(ctx) -> Result`), a name, a default-on flag, and the metric families it may emit
(name, type, help, labels). The runner keeps a check to its declaration: a sample of a
family it did not declare, or with other labels, makes that check fail (a bug in the
check, reported like a crash) and never reaches /metrics. The agent config's `checks`
mapping turns a check on or off per node (`checks: {gpu: false}`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_CLUSTER, AgentError
from tacc_agent.health.checks.base import FAIL, Result, timed

KINDS = ("gauge", "counter")


@dataclass(frozen=True)
class Family:
    """A metric family: name without the tacc_agent_ prefix, type, HELP text, labels."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"family {self.name}: type {self.kind!r}, expected one of {KINDS}")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"family {self.name}: counters, and only counters, end in _total")


@dataclass(frozen=True)
class CheckContext:
    """What every check is given: the agent's settings and what one run shares."""

    config: AgentConfig
    state_dir: Path
    timeout: float  # upper bound of each external probe
    boot_id: str = ""  # this boot's id ("" when unreadable): Xids hold until it changes


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[CheckContext], Result]
    families: tuple[Family, ...] = ()
    default_on: bool = True

    def declared(self) -> dict[str, Family]:
        return {family.name: family for family in self.families}

    def __call__(self, ctx: CheckContext) -> Result:
        """Run it, timed, each probe bounded by ctx.timeout; an unexpected error or an
        undeclared figure is a failure of this check, never a crash of the agent."""
        return timed(self.name, lambda: self.within_declaration(self.run(ctx)))

    def within_declaration(self, result: Result) -> Result:
        declared = self.declared()
        for sample in result.samples:
            family = declared.get(sample.name)
            if family is None:
                problem = f"metric family {sample.name}, which it does not declare"
            elif set(sample.labels) != set(family.labels):
                problem = f"{sample.name} labelled {sorted(sample.labels)}, not {family.labels}"
            else:
                continue
            return Result(self.name, FAIL, f"check emitted {problem}")
        return result


class Registry:
    """The checks in the order they run (a failing check earlier in it names the drain)."""

    def __init__(self, checks: Iterable[Check]) -> None:
        self.checks: dict[str, Check] = {}
        for check in checks:
            if check.name in self.checks:
                raise ValueError(f"health check {check.name} registered twice")
            self.checks[check.name] = check

    def __iter__(self) -> Iterator[Check]:
        return iter(self.checks.values())

    @property
    def names(self) -> list[str]:
        return list(self.checks)

    def selected(self, switches: Mapping[str, bool] | None) -> list[Check]:
        """The checks to run: each by its default-on flag unless the agent config's
        `checks` mapping turns it on or off. An unknown name there is an error."""
        switches = dict(switches or {})
        unknown = sorted(set(switches) - set(self.checks))
        if unknown:
            raise AgentError(
                f"agent config: checks: unknown check(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(self.names)} (each true or false)",
                AGENT_CLUSTER,
            )
        return [check for check in self if switches.get(check.name, check.default_on)]
