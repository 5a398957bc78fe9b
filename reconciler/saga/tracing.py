"""Temporal's TracingInterceptor, with a saga's outcome on its spans (see plnt.core.telemetry).

Imported only when tracing is on (it imports the OpenTelemetry SDK). Temporal's interceptor gives
the saga's workflow zero-length spans (RunWorkflow at its start, CompleteWorkflow at its end) and
sets an ERROR status only on activities that raise. A saga that rolls back or fails does not raise:
it returns a SagaResult saying so. Here its CompleteWorkflow span gets `plnt.phase`, `plnt.reason`
and status ERROR, as does a workflow that raises.
"""

from __future__ import annotations

from typing import Any

import opentelemetry.trace
import temporalio.worker
import temporalio.workflow
from opentelemetry.trace import Status, StatusCode
from plnt.core import telemetry
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor

_FAILED = "plnt.failed"


class SagaTracingInterceptor(TracingInterceptor):
    def workflow_interceptor_class(
        self, input: temporalio.worker.WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)  # registers the extern function the spans go through
        return _SagaWorkflowInterceptor

    def _completed_workflow_span(self, params: Any) -> Any:
        failed = bool(params.attributes and params.attributes.get(_FAILED))
        if not (failed or params.exception):
            return super()._completed_workflow_span(params)
        # As the parent's, plus the ERROR status (the parent only records the exception).
        if params.parent_missing and not self._always_create_workflow_spans:
            return None
        context = self.text_map_propagator.extract(params.context)
        span = self.tracer.start_span(params.name, context, attributes=params.attributes, start_time=params.time_ns,
                                      kind=params.kind)
        if params.exception:
            span.record_exception(params.exception)
        reason = (params.attributes or {}).get("plnt.reason") or (str(params.exception) if params.exception else "failed")
        span.set_status(Status(StatusCode.ERROR, str(reason)[:300]))
        span.end(end_time=params.time_ns)
        carrier: dict[str, Any] = {}
        self.text_map_propagator.inject(carrier, opentelemetry.trace.set_span_in_context(span, context))
        return carrier


class _SagaWorkflowInterceptor(TracingWorkflowInboundInterceptor):
    async def execute_workflow(self, input: temporalio.worker.ExecuteWorkflowInput) -> Any:
        workflow_type = temporalio.workflow.info().workflow_type
        with self._top_level_workflow_context(success_is_complete=False):  # an exception: CompleteWorkflow, ERROR
            self._completed_span(f"RunWorkflow:{workflow_type}", kind=opentelemetry.trace.SpanKind.SERVER)
            result = await self.next.execute_workflow(input)
            phase = getattr(result, "phase", None)
            phase = getattr(phase, "value", phase)
            attributes: dict[str, Any] = {}
            if isinstance(phase, str):
                attributes["plnt.phase"] = phase
                reason = getattr(result, "reason", None)
                if isinstance(reason, str) and reason:
                    attributes["plnt.reason"] = reason[:500]
                if phase in SAGA_FAILED_PHASES:
                    attributes[_FAILED] = True
            self._completed_span(f"CompleteWorkflow:{workflow_type}", additional_attributes=attributes,
                                 kind=opentelemetry.trace.SpanKind.INTERNAL)
            return result


SAGA_FAILED_PHASES = frozenset({"Failed", "RolledBack"})


def temporal_interceptors() -> list[Any]:
    """The interceptors a Temporal client (and the workers made from it) gets: none when off."""
    if not telemetry.ENABLED:
        return []
    return [SagaTracingInterceptor(telemetry.tracer())]
