"""A password hasher for the test process only (conftest.py installs it).

Django's PBKDF2 runs 1,000,000 rounds, about 0.4 s a password on this kind of machine; the
suite creates a few users in most tests, and that was over a third of its time. This hasher
writes the same format with one round, so a server the suite starts (which keeps the shipped
hashers) still verifies it: PBKDF2 reads the rounds from the stored hash. Django's advice for
test suites ("Speeding up the tests": a faster hasher)."""
from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneRoundPBKDF2(PBKDF2PasswordHasher):
    iterations = 1
