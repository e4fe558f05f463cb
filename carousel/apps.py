from django.apps import AppConfig


class CarouselConfig(AppConfig):
    name = "carousel"
    verbose_name = "Carousel"

    def ready(self):
        from . import checks, plugins  # noqa: F401  (registers checks and the cache reset)
