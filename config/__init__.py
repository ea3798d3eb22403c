"""Project configuration: settings, ASGI routing, URLs and the Celery app.

Every entry point (manage.py, Daphne via ``config.asgi``, Celery, pytest) imports this package
before the settings, so a checkout's ``var/secrets.env`` (made by `make run`) fills in the variables
the environment lacks, the same for all of them (``config.env.load_dev_secrets``).
"""

from config.env import load_dev_secrets

load_dev_secrets()

from config.celery import app as celery_app  # noqa: E402 - after the secrets are in the environment

__all__ = ["celery_app"]
