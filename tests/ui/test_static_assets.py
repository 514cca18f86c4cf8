"""plotly.js is served as a static file: compressed, under a versioned URL cached for a year."""

from __future__ import annotations

import gzip

import plotly
import pytest
from django.core.management import call_command
from django.test import Client, override_settings

from apps.experiments.staticfiles import plotly_static_name


def test_the_bundle_is_named_by_the_installed_version():
    assert plotly_static_name() == f"vendor/plotly-{plotly.__version__}/plotly.min.js"


@pytest.mark.django_db
def test_collected_it_goes_out_compressed_with_a_long_lived_cache(tmp_path, client, author, experiment):
    with override_settings(STATIC_ROOT=tmp_path, WHITENOISE_USE_FINDERS=False, WHITENOISE_AUTOREFRESH=False):
        call_command("collectstatic", "--noinput", verbosity=0)
        collected = tmp_path / plotly_static_name()
        assert collected.exists() and (tmp_path / (plotly_static_name() + ".gz")).exists()
        # A fresh client: whitenoise reads the collected files when the middleware starts.
        served = Client().get(f"/static/{plotly_static_name()}", HTTP_ACCEPT_ENCODING="gzip")
        assert served.status_code == 200
        assert served["Cache-Control"] == "max-age=315360000, public, immutable"
        assert served["Content-Encoding"] == "gzip"
        body = gzip.decompress(b"".join(served.streaming_content))
        assert body == collected.read_bytes()
        assert int(served["Content-Length"]) < collected.stat().st_size / 3
    # A page with charts links that URL (a run's page always has them).
    client.force_login(author)
    run = experiment.runs.first()
    page = client.get(f"/runs/{run.run_id}/").content.decode()
    assert f'src="/static/{plotly_static_name()}"' in page
