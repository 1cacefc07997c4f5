"""A link whose concurrent transfers share its bandwidth (offload ``link = "shared"``).

Dynamo's mocker times its G1 <-> G2 copies with a processor-sharing model
(ai-dynamo/dynamo ``lib/mocker/src/kvbm_offload/bandwidth_sharing_model.rs``,
``BandwidthSharingModel``): the ``n`` transfers on a link each progress at
``bandwidth / n``; the one with the fewest bytes left completes first, and
the others speed up. This module reproduces what a port observes of it, with
the same arithmetic in the same order so that deadlines agree to the last
bit:

- a transfer starts at the link's current time with ``bytes`` to send (none
  when the bandwidth is unbounded);
- ``advance(now)`` repeatedly completes the transfer with the fewest bytes
  left (the first such one on a tie, counting in the link's own order, which
  removing a transfer changes as a swap-remove does: the last transfer takes
  the removed one's place) while its completion time is at most
  ``now + 1e-9`` ms, then charges the remaining time to every transfer; a
  time before the link's clock changes nothing;
- a transfer's deadline, were nothing else to start, is the link's clock plus
  the bytes all transfers must still send before it completes, over the
  bandwidth.

Pure and deterministic: no clock of its own, time enters as an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: completion tolerance of the source's model, in ms
EPSILON_MS = 1e-9


@dataclass(slots=True)
class SharedLink:
    """One direction of the G1 <-> G2 link (offload or onboard)."""

    #: bytes per ms (``gbps * 1e6``); ``inf`` when unbounded
    rate: float
    #: active transfers as ``[id, bytes left]``, in the link's order
    active: list[list[float]] = field(default_factory=list)
    clock: float = 0.0

    @classmethod
    def for_bandwidth(cls, gbps: float) -> SharedLink:
        return cls(gbps * 1e6 if gbps > 0 else math.inf)

    def start(self, now: float, ident: int, nbytes: int) -> None:
        now = max(now, self.clock)
        self.clock = now
        self.active.append([float(ident), float(nbytes) if math.isfinite(self.rate) else 0.0])

    def advance(self, now: float) -> list[int]:
        """Move the clock to ``now``; the ids of the transfers that completed, in order."""
        done: list[int] = []
        if now < self.clock:
            return done
        active = self.active
        while True:
            if not active:
                self.clock = now
                return done
            rate_per = self.rate / len(active)
            idx = _first_min(active)
            least = active[idx][1]
            step = least / rate_per if math.isfinite(rate_per) and rate_per > 0 else 0.0
            at = self.clock + step
            if at > now + EPSILON_MS:
                elapsed = now - self.clock
                if math.isfinite(rate_per) and elapsed > 0:
                    delta = elapsed * rate_per
                    for t in active:
                        t[1] = max(t[1] - delta, 0.0)
                self.clock = now
                return done
            if math.isfinite(rate_per) and step > 0:
                delta = step * rate_per
                for t in active:
                    t[1] = max(t[1] - delta, 0.0)
            self.clock = at
            done.append(int(_swap_remove(active, idx)[0]))

    def earliest(self) -> float | None:
        """When the next transfer completes if nothing else starts."""
        if not self.active:
            return None
        least = self.active[_first_min(self.active)][1]
        if math.isfinite(self.rate) and self.rate > 0:
            return self.clock + sum(min(t[1], least) for t in self.active) / self.rate
        return self.clock

    def deadline_for(self, ident: int) -> float | None:
        """When transfer ``ident`` completes if nothing else starts."""
        mine = next((t[1] for t in self.active if int(t[0]) == ident), None)
        if mine is None:
            return None
        if math.isfinite(self.rate) and self.rate > 0:
            return self.clock + sum(min(t[1], mine) for t in self.active) / self.rate
        return self.clock

    def state(self) -> tuple[object, ...]:
        return (self.clock, tuple((int(i), r) for i, r in self.active))


def _first_min(active: list[list[float]]) -> int:
    best = 0
    for i in range(1, len(active)):
        if active[i][1] < active[best][1]:
            best = i
    return best


def _swap_remove(items: list[list[float]], idx: int) -> list[float]:
    last = items.pop()
    if idx == len(items):
        return last
    out = items[idx]
    items[idx] = last
    return out
