"""/api/v1/ endpoints, /api/schema/ (OpenAPI 3), /api/docs/ (Swagger UI), /api/redoc/.

Registering an endpoint is one line below; the schema picks it up. See docs/api.md.
"""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from tools_app.api.approval_requests import ApprovalRequestViewSet
from tools_app.api.audit_chain import AuditChainVerifyView
from tools_app.api.audit_events import AuditEventViewSet
from tools_app.api.idempotency_records import IdempotencyRecordViewSet
from tools_app.api.outbox_events import OutboxEventViewSet
from tools_app.api.task_events import task_events
from tools_app.api.tasks import CheckpointViewSet, TaskViewSet

router = SimpleRouter(trailing_slash=False)
router.register("idempotency-records", IdempotencyRecordViewSet, basename="idempotency-record")
router.register("audit-events", AuditEventViewSet, basename="audit-event")
router.register("approval-requests", ApprovalRequestViewSet, basename="approval-request")
router.register("outbox-events", OutboxEventViewSet, basename="outbox-event")
router.register("tasks", TaskViewSet, basename="task")
router.register("checkpoints", CheckpointViewSet, basename="checkpoint")

# Routes that are not viewsets.
v1_routes = [*router.urls,
             path("audit-chain/verify", AuditChainVerifyView.as_view(), name="audit-chain-verify")]
# What the schema documents: exactly the /api/v1/ routes.
v1_patterns = [path("api/v1/", include(v1_routes))]

urlpatterns = [
    # Downstream systems' events for tasks in a durable wait (bearer API token; not an auditor endpoint).
    path("v1/task-events", task_events, name="task-events"),
    path("v1/", include(v1_routes)),
    path("schema/", SpectacularAPIView.as_view(patterns=v1_patterns), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    # Log in for session access (auditors without admin access use this page).
    path("auth/", include("rest_framework.urls")),
]
