"""The reference model: pure, deterministic state machines of each profile.

``make_model(config)`` returns the model of ``config.profile``; every model
implements ``reference.outcome.Model``. ``RouterView`` is the consumer side:
it applies an event stream the way a router's indexer does and reports
protocol violations by rule id.

The names below are imported on first use (PEP 562): ``kvspec check-log``
needs only ``reference.router_view``, and importing the models with their
configuration schema would cost it a third of a second at start-up.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from kvspec.reference.g1 import G1Model
    from kvspec.reference.legacy import LegacyModel
    from kvspec.reference.outcome import Model, Step
    from kvspec.reference.router_view import RouterView, Violation
    from kvspec.spec.config import ManagerConfig

__all__ = ["G1Model", "LegacyModel", "Model", "RouterView", "Step", "Violation", "make_model"]

_LAZY = {
    "G1Model": ".g1",
    "LegacyModel": ".legacy",
    "Model": ".outcome",
    "Step": ".outcome",
    "RouterView": ".router_view",
    "Violation": ".router_view",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(mod, __name__), name)
    globals()[name] = value
    return value


def make_model(config: ManagerConfig) -> Model:
    """The reference model of a block-level profile (spec.registry names it);
    the allocator-level and radix models take their own configs."""
    from kvspec.spec import registry
    from kvspec.spec.errors import ConfigError

    entry = registry.PROFILES.get(config.profile)
    if entry is None or entry.family != "block":
        raise ConfigError(
            f"no block-level model for profile {config.profile!r}; block-level: {registry.names('block')}"
        )
    # the registry types every factory with the protocol of all profiles (spec.model.ProfileModel);
    # a block-level model also has the block lockstep's richer view
    return cast("Model", entry.resolve_model()(config))
