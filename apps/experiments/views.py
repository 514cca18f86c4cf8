from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.experiments.models import Experiment


def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = Experiment.objects.select_related("owner")
    return render(request, "experiments/list.html", {"experiments": experiments})
