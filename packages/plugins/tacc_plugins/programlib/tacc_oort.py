"""Oort's participant selection for federated learning (Lai et al., OSDI'21), small and
standard-library only: the `oort` plug-in copies this module into the job and puts it on
the program's PYTHONPATH, and sets TACC_PARTICIPANT_SELECTION=oort.

Each round the selector picks `per_round` clients out of all of them:

- exploitation, a share 1 - epsilon: clients already tried, scored by
  [ normalised statistical utility + staleness bonus ] x system utility, where the
  statistical utility is |B_i| * sqrt(sum(loss^2) / |B_i|) of the samples B_i the client
  trained on last, the staleness bonus sqrt(0.1 ln R / L_i) (R the round, L_i the round
  it was last picked), and the system utility (T / t_i)^alpha when its duration t_i is
  over the preferred round duration T (1 otherwise). It samples, weighted by score,
  among the clients scoring at least `cut_off` x the score of the last one that fits;
- exploration, a share epsilon that decays each round: clients never tried, the faster
  first when the program gives duration hints;
- a pacer: every `pacer_window` rounds, when the exploited utility of the last window did
  not grow by more than 10 % over the window before, T is relaxed by `pacer_step_s`
  (so slower clients with useful data get in); when it grew more than five-fold, T is
  tightened by the same step;
- a blacklist: clients picked more than `blacklist_rounds` times are left out (at most
  30 % of the clients); off by default, as in Oort's code.

    selector = selector_from_env(client_ids)      # Oort when the plug-in is on, else random
    for round_number in range(1, rounds + 1):
        for client in selector.select(round_number):
            ...train...
            selector.update(client, loss_sq_sum, samples, duration_s)

Both selectors are deterministic for a seed.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Hashable, Mapping, Sequence

ENV_SELECTION = "TACC_PARTICIPANT_SELECTION"

# Defaults: FedScale's port of Oort (thirdparty/oort, config_parser.py) unless noted.
EXPLORATION = 0.9  # initial epsilon
EXPLORATION_DECAY = 0.98  # per round (Oort's own repository: 0.95)
EXPLORATION_MIN = 0.3  # (Oort's own repository: 0.2)
CUT_OFF = 0.95  # sample among scores >= CUT_OFF x the last fitting one (Oort repo: 0.7)
CLIP_PERCENTILE = 0.95  # utilities clipped here before min-max (Oort 0.98, FedScale 0.9)
ROUND_PENALTY = 2.0  # alpha
PACER_WINDOW = 20  # W rounds
SAMPLE_WINDOW = 5.0  # exploration draws from the 5 x n fastest unexplored clients
BLACKLIST_SHARE = 0.3  # at most this share of the clients is blacklisted
STALENESS = 0.1


def statistical_utility(loss_sq_sum: float, samples: int) -> float:
    """|B| * sqrt(sum(loss^2) / |B|): large for clients with much data the model gets wrong."""
    if samples <= 0:
        return 0.0
    return samples * math.sqrt(max(loss_sq_sum, 0.0) / samples)


def staleness_bonus(round_number: int, last_round: int) -> float:
    """sqrt(0.1 ln R / L): Oort's temporal-uncertainty term (L: the round last picked)."""
    if round_number <= 1:
        return 0.0
    return math.sqrt(STALENESS * math.log(round_number) / max(last_round, 1))


def system_utility(deadline_s: float, duration_s: float, alpha: float = ROUND_PENALTY) -> float:
    """(T / t)^alpha when the client is slower than the preferred duration T, else 1."""
    if duration_s <= deadline_s or duration_s <= 0:
        return 1.0
    return (deadline_s / duration_s) ** alpha


def weighted_sample(rng: random.Random, items: list, weights: list[float], count: int) -> list:
    """`count` distinct items drawn with probability proportional to weight."""
    items, weights, picked = list(items), [max(w, 1e-12) for w in weights], []
    while items and len(picked) < count:
        point, index = rng.random() * sum(weights), 0
        while index < len(items) - 1 and point >= weights[index]:
            point -= weights[index]
            index += 1
        picked.append(items.pop(index))
        weights.pop(index)
    return picked


class RandomSelector:
    """Uniform random participants (the baseline): the same interface as OortSelector."""

    name = "random"

    def __init__(self, client_ids: Sequence[Hashable], per_round: int, seed: int = 0) -> None:
        if not 1 <= per_round <= len(client_ids):
            raise ValueError(f"per_round must be 1..{len(client_ids)}, got {per_round}")
        self.clients, self.per_round = list(client_ids), per_round
        self.rng = random.Random(seed)  # noqa: S311 (a simulation, not secrets)

    def select(self, round_number: int) -> list:
        return self.rng.sample(self.clients, self.per_round)

    def update(self, client: Hashable, loss_sq_sum: float, samples: int, duration_s: float) -> None:
        """Random selection learns nothing."""


class OortSelector:
    """Oort's training selector (module docstring). `duration_hints`: the expected round
    duration of clients not yet tried (a device profile), used to explore faster first."""

    name = "oort"

    def __init__(
        self,
        client_ids: Sequence[Hashable],
        per_round: int,
        round_deadline_s: float,
        seed: int = 0,
        *,
        alpha: float = ROUND_PENALTY,
        exploration: float = EXPLORATION,
        exploration_decay: float = EXPLORATION_DECAY,
        exploration_min: float = EXPLORATION_MIN,
        cut_off: float = CUT_OFF,
        pacer_window: int = PACER_WINDOW,
        pacer_step_s: float | None = None,
        blacklist_rounds: int | None = None,
        duration_hints: Mapping[Hashable, float] | None = None,
    ) -> None:
        if not 1 <= per_round <= len(client_ids):
            raise ValueError(f"per_round must be 1..{len(client_ids)}, got {per_round}")
        if round_deadline_s <= 0:
            raise ValueError(f"round_deadline_s must be > 0, got {round_deadline_s}")
        self.clients, self.per_round = list(client_ids), per_round
        self.rng = random.Random(seed)  # noqa: S311 (a simulation, not secrets)
        self.deadline_s, self.alpha, self.cut_off = float(round_deadline_s), alpha, cut_off
        self.exploration, self.decay, self.exploration_min = (
            exploration,
            exploration_decay,
            exploration_min,
        )
        self.pacer_window = pacer_window
        # Oort's code relaxes a percentile by 5 points; T is in seconds here: a quarter of it.
        self.pacer_step_s = pacer_step_s if pacer_step_s is not None else self.deadline_s / 4
        self.blacklist_rounds = blacklist_rounds
        self.hints = dict(duration_hints or {})
        self.utility: dict = {}  # client -> statistical utility of its last round
        self.duration: dict = {}  # client -> its last measured duration
        self.last_round: dict = {}  # client -> round it was last picked
        self.picks: dict = {}  # client -> how many times picked
        self.exploited_utility: list[float] = []  # per round, for the pacer

    # ------------------------------------------------------------------ feedback
    def update(self, client: Hashable, loss_sq_sum: float, samples: int, duration_s: float) -> None:
        """What a participant reported after its round: its summed squared losses over the
        samples it trained on, their count, and how long its round took."""
        self.utility[client] = statistical_utility(loss_sq_sum, samples)
        self.duration[client] = float(duration_s)

    # ------------------------------------------------------------------ selection
    def blacklisted(self) -> set:
        if self.blacklist_rounds is None or self.blacklist_rounds < 0:
            return set()
        over = [c for c in self.clients if self.picks.get(c, 0) > self.blacklist_rounds]
        over.sort(key=lambda c: -self.picks[c])  # the most picked first
        return set(over[: int(BLACKLIST_SHARE * len(self.clients))])

    def scores(self, round_number: int, candidates: list) -> dict:
        """Oort's score of every explored candidate."""
        raw = sorted(self.utility[c] for c in candidates)
        if not raw:
            return {}
        low = raw[0]
        high = raw[min(len(raw) - 1, int(CLIP_PERCENTILE * (len(raw) - 1)))]
        span = max(high - low, 1e-12)
        return {
            c: (
                min(self.utility[c] - low, span) / span
                + staleness_bonus(round_number, self.last_round.get(c, 0))
            )
            * system_utility(self.deadline_s, self.duration[c], self.alpha)
            for c in candidates
        }

    def pace(self, round_number: int) -> None:
        window = self.pacer_window
        history = self.exploited_utility
        if window <= 0 or len(history) < 2 * window or round_number % window:
            return
        last, before = sum(history[-window:]), sum(history[-2 * window : -window])
        if last <= 1.1 * before:  # the utility dropped or stalled: let slower clients in
            self.deadline_s += self.pacer_step_s
        elif last >= 6 * before:
            self.deadline_s = max(self.pacer_step_s, self.deadline_s - self.pacer_step_s)

    def select(self, round_number: int) -> list:
        """The participants of round `round_number` (1, 2, ...)."""
        self.pace(round_number)
        left_out = self.blacklisted()
        pool = [c for c in self.clients if c not in left_out]
        explored = [c for c in pool if c in self.utility]
        unexplored = [c for c in pool if c not in self.utility and c not in self.last_round]
        if not unexplored:  # every client tried: exploit only from now on (as Oort's code)
            self.exploration = self.exploration_min = 0.0
        exploit_count = min(int(self.per_round * (1 - self.exploration)), len(explored))
        picked = self.exploit(round_number, explored, exploit_count)
        explore_count = min(self.per_round - len(picked), len(unexplored))
        picked += self.explore(unexplored, explore_count)
        rest = [c for c in explored if c not in set(picked)] or [
            c for c in pool if c not in set(picked)
        ]
        picked += self.rng.sample(rest, min(self.per_round - len(picked), len(rest)))
        if len(picked) < self.per_round:  # the blacklist left too few: take some back
            others = [c for c in self.clients if c not in set(picked)]
            picked += self.rng.sample(others, self.per_round - len(picked))
        for client in picked:
            self.last_round[client] = round_number
            self.picks[client] = self.picks.get(client, 0) + 1
        self.exploration = max(self.exploration * self.decay, self.exploration_min)
        return picked

    def exploit(self, round_number: int, explored: list, count: int) -> list:
        if count <= 0:
            self.exploited_utility.append(0.0)
            return []
        scores = self.scores(round_number, explored)
        ranked = sorted(explored, key=lambda c: -scores[c])
        bar = self.cut_off * scores[ranked[count - 1]]
        candidates = [c for c in ranked if scores[c] >= bar]
        picked = weighted_sample(self.rng, candidates, [scores[c] for c in candidates], count)
        self.exploited_utility.append(sum(self.utility[c] for c in picked))
        return picked

    def explore(self, unexplored: list, count: int) -> list:
        if count <= 0:
            return []
        if not self.hints:
            return self.rng.sample(unexplored, count)
        inf = float("inf")
        fastest = sorted(unexplored, key=lambda c: self.hints.get(c, inf))
        window = fastest[: max(count, int(SAMPLE_WINDOW * count))]
        weights = [
            system_utility(self.deadline_s, self.hints.get(c, self.deadline_s), self.alpha)
            for c in window
        ]
        return weighted_sample(self.rng, window, weights, count)


def env_number(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    try:
        return float(env[name])
    except (KeyError, ValueError):
        return default


def selector_from_env(
    client_ids: Sequence[Hashable],
    per_round: int | None = None,
    round_deadline_s: float | None = None,
    seed: int = 0,
    duration_hints: Mapping[Hashable, float] | None = None,
    env: Mapping[str, str] | None = None,
) -> OortSelector | RandomSelector:
    """OortSelector when TACC_PARTICIPANT_SELECTION=oort (the plug-in is on), else the
    seeded random selector. Unset arguments come from TACC_FL_PER_ROUND,
    TACC_FL_ROUND_DEADLINE_S, TACC_FL_ROUND_PENALTY, TACC_FL_BLACKLIST_ROUNDS."""
    env = os.environ if env is None else env
    if per_round is None:
        per_round = int(env_number(env, "TACC_FL_PER_ROUND", min(10, len(client_ids))) or 1)
    if env.get(ENV_SELECTION, "").strip().lower() != "oort":
        return RandomSelector(client_ids, per_round, seed)
    deadline = round_deadline_s or env_number(env, "TACC_FL_ROUND_DEADLINE_S", None)
    if deadline is None:
        raise ValueError(
            "Oort needs a preferred round duration: round_deadline_s or TACC_FL_ROUND_DEADLINE_S"
        )
    blacklist = env_number(env, "TACC_FL_BLACKLIST_ROUNDS", None)
    return OortSelector(
        client_ids,
        per_round,
        deadline,
        seed,
        alpha=env_number(env, "TACC_FL_ROUND_PENALTY", ROUND_PENALTY) or ROUND_PENALTY,
        blacklist_rounds=None if blacklist is None else int(blacklist),
        duration_hints=duration_hints,
    )
