from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"

    def ready(self):
        from . import authentication

        # The cached token look-ups are forgotten when what they depend on changes.
        authentication.connect()
