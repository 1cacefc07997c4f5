"""A request-level session of the reference server (protocol version 2).

``EngineSession`` wraps the reference engine (``reference.requests.RequestEngine``:
the vllm profile's model driven by the request driver) and answers each
request-level operation of ``spec.engine_wire`` with its ``EngineOutcome``.
Decode blocks are hashed over synthetic hidden tokens, as in
``adapters/reference_requests``, so the suite's handling of decode hashes it
cannot predict is exercised through the protocol too.

``driver_type`` and ``model_type`` are the request driver and the pool to
run: the reference's, or a request-level mutant's
(``adapters/mutants/request_bugs.py``), which the server selects with
``--mutant NAME``.
"""

from __future__ import annotations

from kvspec.api import (
    EngineCall,
    PoolSetup,
    RequestDriver,
    RequestEngine,
    RequestSpec,
    SyntheticDecode,
    VllmPoolModel,
    make_engine,
)
from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import (
    AddRequest,
    EngineConfig,
    EngineOp,
    EngineOutcome,
    EngineStep,
    FinishedRequest,
)
from kvspec.spec.errors import ConfigError


class EngineSession:
    """One request-level session: a fresh engine, then one outcome per operation."""

    def __init__(
        self,
        config: ManagerConfig,
        engine: EngineConfig,
        *,
        salt: int = 1,
        driver_type: type[RequestDriver] = RequestDriver,
        model_type: type[VllmPoolModel] = VllmPoolModel,
    ) -> None:
        try:
            setup = PoolSetup(manager=config, host_blocks=engine.host_blocks)
        except ValueError as e:  # pydantic: the profile is not vllm
            raise ConfigError(f"a request-level session needs the vllm profile: {e}") from None
        self.engine: RequestEngine = make_engine(
            setup, SyntheticDecode(config.block_size, salt=salt), driver_type=driver_type, model_type=model_type
        )

    def apply(self, op: EngineOp) -> EngineOutcome:
        """Apply one operation. ConfigError: an id already in use (a protocol error)."""
        reset: bool | None = None
        if isinstance(op, AddRequest):
            call = self.engine.add(op.request_id, RequestSpec(prompt=op.prompt, max_tokens=op.max_tokens))
        elif isinstance(op, EngineStep):
            call = self.engine.step()
        else:
            reset, call = self.engine.reset_prefix_cache()
        return self.outcome(call, reset)

    def outcome(self, call: EngineCall, reset: bool | None = None) -> EngineOutcome:
        eng = self.engine
        finished = [
            FinishedRequest(request_id=f.request_id, finish_reason="rejected")
            if f.rejected
            else FinishedRequest(
                request_id=f.request_id,
                finish_reason="length",
                cached_tokens=f.result.cached_tokens,
                output_tokens=f.spec.max_tokens,
            )
            for f in call.finished
        ]
        # the events are the model's own, already valid: no second validation
        return EngineOutcome.model_construct(
            finished=finished,
            running=len(eng.running),
            waiting=len(eng.waiting),
            reset=reset,
            counters=eng.model.counters(),
            events=call.events,
        )
