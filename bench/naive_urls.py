"""A non-streaming CSV export, for comparison only: the same endpoint, filters and serializer,
with every row loaded and the whole file built in memory before it is sent."""

from django.http import HttpResponse
from django.urls import include, path
from rest_framework.decorators import action
from rest_framework.renderers import JSONRenderer
from rest_framework.routers import SimpleRouter

from idemops.urls import urlpatterns as project_urlpatterns
from tools_app.api.csv_export import CONTENT_TYPE, csv_chunks
from tools_app.api.endpoints import CSVRenderer
from tools_app.api.idempotency_records import IdempotencyRecordViewSet


class BuiltWholeExport(IdempotencyRecordViewSet):
    @action(detail=False, url_path="naive-export.csv", renderer_classes=[JSONRenderer, CSVRenderer],
            pagination_class=None)
    def naive_export(self, request):
        queryset = self.filter_queryset(self.get_queryset())
        data = self.get_serializer(list(queryset), many=True).data
        columns = self.get_csv_fields()
        body = b"".join(csv_chunks(columns, ([row.get(c) for c in columns] for row in data)))
        return HttpResponse(body, content_type=CONTENT_TYPE)


router = SimpleRouter(trailing_slash="")
router.register("idempotency-records", BuiltWholeExport, basename="naive-record")

urlpatterns = [path("api/v1/", include(router.urls)), *project_urlpatterns]
