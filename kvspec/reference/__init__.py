"""The reference model: pure, deterministic state machines of each profile.

``make_model(config)`` returns the model of ``config.profile``; every model
implements ``reference.outcome.Model``. ``RouterView`` is the consumer side:
it applies an event stream the way a router's indexer does and reports
protocol violations by rule id.
"""

from __future__ import annotations

from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError

from .g1 import G1Model
from .legacy import LegacyModel
from .outcome import Model, Step
from .router_view import RouterView, Violation

__all__ = ["G1Model", "LegacyModel", "Model", "RouterView", "Step", "Violation", "make_model"]


def make_model(config: ManagerConfig) -> Model:
    """The reference model of the configuration's profile."""
    if config.profile in ("kvbm", "atomic"):
        return G1Model(config)
    if config.profile == "legacy":
        return LegacyModel(config)
    if config.profile == "vllm":
        from .vllm_pool import VllmPoolModel

        return VllmPoolModel(config)
    raise ConfigError(f"unknown profile {config.profile!r}")
