"""The versioned REST API, /api/v1/ (Django REST framework; the OpenAPI document by drf-spectacular).

Every endpoint needs a bearer token (apps/api/auth.py) and acts as the token's
user with that user's roles; the services are the same the pages call, so the
rules (four eyes, field errors, nothing half-saved) are the same too. Every
audit event written during an API call names the token.

Errors are JSON: ``{"detail": ...}``, and for a bad spec ``{"errors": [{"field",
"message"}]}`` with status 400.

This module holds the experiments resource (list, create, start, cancel, report, approve,
revoke, manifest). The others: views_runs.py (runs and their records), views_traces.py (trace
uploads), gates.py (the gate); what they share (ApiView, the parsers, the error bodies) is in
apps/api/base.py.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.utils.decorators import method_decorator
from django.views.decorators.gzip import gzip_page
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ParseError
from rest_framework.exceptions import PermissionDenied as ApiForbidden
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.roles import EXPERIMENTER, VIEWER
from apps.accounts.tokens import APPROVE, RUN
from apps.analysis import stored_report
from apps.api.base import SPEC_ERRORS, ApiView, SpecJsonParser, YamlParser, _clean_text, _errors
from apps.approvals.bundle import bundle_download
from apps.approvals.models import RollbackManifest
from apps.approvals.services import ApprovalError, approval_revoke, experiment_approve
from apps.approvals.views import bundle_response, manifest_response
from apps.experiments.models import Experiment
from apps.experiments.services import spec_limits
from apps.experiments.spec import SpecError, validate_spec
from apps.lifecycle import selectors
from apps.lifecycle.creation import experiment_create


def _summary(experiment: Experiment) -> dict[str, Any]:
    progress = selectors.experiment_progress(experiment=experiment)
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    return {
        "id": experiment.pk,
        "name": experiment.name,
        "owner": experiment.owner.get_username(),
        "status": experiment.status,
        "status_reason": experiment.status_reason,
        "progress": {
            "total": progress.total,
            "finished": progress.finished,
            "by_status": progress.by_status,
            "eta_s": progress.eta_s,
        },
        "decision": None
        if decision is None
        else {"outcome": decision.outcome, "chosen_cell": decision.chosen_cell, "rule": decision.rule},
    }


EXPERIMENT = inline_serializer(
    "Experiment",
    {
        "id": serializers.IntegerField(),
        "name": serializers.CharField(),
        "owner": serializers.CharField(),
        "status": serializers.CharField(),
        "status_reason": serializers.CharField(),
        "progress": serializers.DictField(),
        "decision": serializers.DictField(allow_null=True),
    },
)
EXPERIMENTS = inline_serializer(
    "ExperimentPage",
    {
        "experiments": serializers.ListField(child=serializers.DictField()),
        "count": serializers.IntegerField(),
        "page": serializers.IntegerField(allow_null=True),
        "pages": serializers.IntegerField(allow_null=True),
        "next": serializers.CharField(allow_null=True),
    },
)
LIST_FILTERS = [
    OpenApiParameter("status", str, description="only experiments in this status"),
    OpenApiParameter("owner", str, description="only this user's experiments (username)"),
    OpenApiParameter(
        "route",
        str,
        description="only experiments whose approval or gate names this route target (contained)",
    ),
    OpenApiParameter("since", OpenApiTypes.DATE, description="created on or after this day (UTC)"),
    OpenApiParameter("until", OpenApiTypes.DATE, description="created on or before this day (UTC)"),
    OpenApiParameter("q", str, description="in the name or description"),
    OpenApiParameter(
        "page", int, description="25 a page; without it, the newest 200 that match (as before pages existed)"
    ),
]


class ExperimentList(ApiView):
    parser_classes = [SpecJsonParser, YamlParser]
    scopes = {**ApiView.scopes, "POST": RUN}

    @extend_schema(
        parameters=LIST_FILTERS,
        responses={200: EXPERIMENTS},
        summary="Experiments, newest first, filtered as the list page filters them",
        operation_id="experiments_list",
    )
    def get(self, request: Request) -> Response:
        from django.core.paginator import Paginator

        from apps.history.list_filters import PAGE_SIZE, FilterError, parse_list_filters, parse_page
        from apps.history.selectors import experiments_filtered

        self.need(VIEWER)
        try:
            filters = parse_list_filters(request.query_params)
            number = parse_page(request.query_params.get("page")) if "page" in request.query_params else None
        except FilterError as exc:
            raise ParseError({exc.field: exc.message}) from None
        rows = experiments_filtered(filters)
        if number is None:  # the answer before pages existed: the newest 200, and how many match
            return Response(
                {
                    "experiments": [_summary(e) for e in rows[:200]],
                    "count": rows.count(),
                    "page": None,
                    "pages": None,
                    "next": None,
                }
            )
        page = Paginator(rows, PAGE_SIZE).get_page(number)
        following = None
        if page.has_next():
            following = request.build_absolute_uri(
                "?" + urlencode({**filters.query(), "page": page.next_page_number()})
            )
        return Response(
            {
                "experiments": [_summary(e) for e in page.object_list],
                "count": page.paginator.count,
                "page": page.number,
                "pages": page.paginator.num_pages,
                "next": following,
            }
        )

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT, "application/yaml": OpenApiTypes.STR},
        responses={201: EXPERIMENT, 400: SPEC_ERRORS},
        summary="Create an experiment from a spec (JSON or YAML); the token's user is its author",
    )
    def post(self, request: Request) -> Response:
        self.need(EXPERIMENTER)
        try:
            spec = validate_spec(request.data, limits=spec_limits())
            experiment = experiment_create(spec=spec, owner=request.user)
        except SpecError as exc:
            return Response({"errors": _errors(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(_summary(experiment), status=status.HTTP_201_CREATED)


class ExperimentDetail(ApiView):
    @extend_schema(responses={200: EXPERIMENT}, summary="Status, progress and decision")
    def get(self, request: Request, pk: int) -> Response:
        return Response(_summary(self.experiment(pk)))


class ExperimentStart(ApiView):
    scopes = {"POST": RUN}

    @extend_schema(request=None, responses={202: EXPERIMENT, 409: OpenApiTypes.OBJECT}, summary="Start")
    def post(self, request: Request, pk: int) -> Response:
        from apps.lifecycle.running import experiment_start

        experiment = self.experiment(pk)
        if not selectors.can_operate(request.user, experiment):
            raise ApiForbidden("only the experiment's author can start it")
        try:
            experiment_start(experiment=experiment, actor=request.user)
        except ValueError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        experiment.refresh_from_db()
        return Response(_summary(experiment), status=status.HTTP_202_ACCEPTED)


class ExperimentCancel(ApiView):
    scopes = {"POST": RUN}

    @extend_schema(request=None, responses={200: EXPERIMENT, 409: OpenApiTypes.OBJECT}, summary="Cancel")
    def post(self, request: Request, pk: int) -> Response:
        from apps.lifecycle.running import experiment_cancel

        experiment = self.experiment(pk)
        if not selectors.can_operate(request.user, experiment):
            raise ApiForbidden("only the experiment's author can cancel it")
        if experiment.status != Experiment.Status.RUNNING:
            return Response(
                {"detail": f"the experiment is {experiment.status}"}, status=status.HTTP_409_CONFLICT
            )
        experiment_cancel(experiment=experiment, actor=request.user)
        experiment.refresh_from_db()
        if experiment.status != Experiment.Status.CANCELLED:
            return Response(
                {"detail": f"the experiment is {experiment.status}"}, status=status.HTTP_409_CONFLICT
            )
        return Response(_summary(experiment))


# Compressed (GZipMiddleware on this view only): a seed sweep's report is over a megabyte of JSON.
# A token-authenticated GET that reflects nothing of the request and carries no CSRF token.
@method_decorator(gzip_page, name="dispatch")
class ExperimentReport(ApiView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, 409: OpenApiTypes.OBJECT},
        summary="The report: the same JSON as `experiment_report --format json` (a search carries its trials)",
    )
    def get(self, request: Request, pk: int) -> Response:
        experiment = self.experiment(pk)
        decision = stored_report.decision_of(experiment.pk)
        text = stored_report.report_text(decision) if decision is not None else b"{}"
        if text in (b"{}", b"null"):
            return Response({"detail": f"no report yet: the experiment is {experiment.status}"}, status=409)
        # The stored JSON text as it is (apps/analysis/stored_report.py): parsing 1.6 MB only to
        # encode it again cost more than the rest of the request.
        return HttpResponse(text, content_type="application/json")


APPROVAL = inline_serializer(
    "Approval",
    {
        "chosen_cell": serializers.CharField(),
        "reason": serializers.CharField(),
        "recovery_override": serializers.CharField(required=False),
        "scenarios_override": serializers.CharField(required=False),
        "deployment_revision": serializers.CharField(),
        "route_target": serializers.CharField(),
    },
)


class ExperimentApprove(ApiView):
    scopes = {"POST": APPROVE}

    @extend_schema(
        request=APPROVAL,
        responses={201: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT, 403: OpenApiTypes.OBJECT},
        summary="Approve (approver, not the author): freezes the rollback manifest",
    )
    def post(self, request: Request, pk: int) -> Response:
        experiment = self.experiment(pk)
        if not isinstance(request.data, dict):
            return Response({"errors": [{"field": "body", "message": "must be a JSON object"}]}, status=400)
        data = request.data
        fields = {
            k: data.get(k, "")
            for k in (
                "chosen_cell",
                "reason",
                "recovery_override",
                "scenarios_override",
                "deployment_revision",
                "route_target",
            )
        }
        bad = [k for k, v in fields.items() if not _clean_text(v, 2000)]
        if bad:
            return Response(
                {"errors": [{"field": k, "message": "must be text of at most 2000 characters"} for k in bad]},
                status=400,
            )
        try:
            manifest = experiment_approve(experiment=experiment, approver=request.user, **fields)
        except PermissionDenied as exc:
            raise ApiForbidden(str(exc)) from None
        except ApprovalError as exc:
            body: dict[str, Any] = {"detail": str(exc)}
            if exc.field:
                body["errors"] = [{"field": exc.field, "message": str(exc)}]
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        return Response(
            {
                "experiment": experiment.pk,
                "chosen_cell": fields["chosen_cell"],
                "manifest_sha256": manifest.sha256,
            },
            status=status.HTTP_201_CREATED,
        )


REVOCATION = inline_serializer("Revocation", {"reason": serializers.CharField()})


class ExperimentRevoke(ApiView):
    scopes = {"POST": APPROVE}

    @extend_schema(
        request=REVOCATION,
        responses={200: EXPERIMENT, 400: OpenApiTypes.OBJECT, 403: OpenApiTypes.OBJECT},
        summary="Revoke an approval (an approver): the manifest is superseded, its digest still verifies",
    )
    def post(self, request: Request, pk: int) -> Response:
        experiment = self.experiment(pk)
        reason = request.data.get("reason", "") if isinstance(request.data, dict) else None
        if not _clean_text(reason, 2000):
            return Response(
                {"errors": [{"field": "reason", "message": "must be text of at most 2000 characters"}]},
                status=400,
            )
        try:
            approval_revoke(experiment=experiment, actor=request.user, reason=str(reason))
        except PermissionDenied as exc:
            raise ApiForbidden(str(exc)) from None
        except ApprovalError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        experiment.refresh_from_db()
        return Response(_summary(experiment))


class ExperimentManifest(ApiView):
    @extend_schema(
        parameters=[OpenApiParameter("fmt", str, OpenApiParameter.PATH, enum=["json", "yaml"])],
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "application/yaml"): OpenApiTypes.STR,
        },
        summary="The approved rollback manifest, byte for byte as stored (header X-Manifest-File-Sha256)",
    )
    def get(self, request: Request, pk: int, fmt: str) -> HttpResponse:
        self.experiment(pk)
        if fmt not in ("json", "yaml"):
            raise NotFound("the manifest comes as json or yaml")
        manifest = RollbackManifest.objects.filter(experiment_id=pk).first()
        if manifest is None:
            raise NotFound("no manifest: the experiment is not approved")
        return manifest_response(manifest, fmt)


class ExperimentBundle(ApiView):
    @extend_schema(
        responses={(200, "text/html"): OpenApiTypes.STR},
        summary="The review bundle: one self-contained HTML file (header X-Bundle-Sha256; the download is audited)",
    )
    def get(self, request: Request, pk: int) -> HttpResponse:
        experiment = self.experiment(pk)
        try:
            bundle = bundle_download(experiment=experiment, actor=request.user)
        except ValueError as exc:
            raise NotFound(str(exc)) from None
        return bundle_response(bundle)
