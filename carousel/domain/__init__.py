"""The request domain: what a restore request is and the writes and reads on it (services, selectors, the intake, pins, paths, who may do what)."""
