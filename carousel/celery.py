import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

app = Celery("carousel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def schedule_cycle(sender, **kwargs):
    from django.conf import settings

    tick = settings.CAROUSEL_TICK_S
    # expires < tick: a tick that waited in the queue past the next one is dropped, not stacked.
    sender.add_periodic_task(tick, sender.signature("carousel.tasks.cycle_tick"), name="cycle tick",
                             expires=tick * 0.9)
    if settings.CAROUSEL_WLCG_ISSUERS:
        # WLCG issuers' keys: the task refetches only sets older than CAROUSEL_WLCG_KEYS_REFRESH_S.
        # Imported only when issuers are trusted, so a worker without them starts no slower.
        import carousel.wlcg  # noqa: F401 - registers the task

        sender.add_periodic_task(600.0, sender.signature("carousel.wlcg.refresh_all_keys"), name="wlcg keys",
                                 expires=540.0)
