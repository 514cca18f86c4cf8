from __future__ import annotations

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()
# Everything imported so far (Django, the apps, numpy, scipy) lives as long as the process: moved
# out of the collector's generations, so a request's garbage collections no longer walk it
# (and forked gunicorn workers keep those pages shared, not copied by the collector's writes).
gc.collect()
gc.freeze()
