from django.apps import AppConfig


class CarouselConfig(AppConfig):
    name = "carousel"
    verbose_name = "Carousel"

    def ready(self):
        from carousel import tasks  # noqa: F401  (every process knows the tasks: infra.queue sends them by name)
        from carousel.infra import checks, plugins  # noqa: F401  (registers checks and the cache reset)
        from carousel.ops import retention  # noqa: F401  (registers the beat's prune task with the worker)
        from django.contrib import admin
        from django.utils.functional import lazy

        from carousel.infra.deploy import stager_notice

        # The admin's pages say it too when the tape library is simulated (read per page).
        admin.site.site_header = lazy(lambda: " · ".join(filter(None, ["Carousel administration",
                                                                        stager_notice()])), str)()
