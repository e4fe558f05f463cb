"""Plumbing: database helpers, the shared cache, the plugin registry, deployment checks, local services for tests."""
