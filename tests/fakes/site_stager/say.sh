#!/bin/sh
# Prints $FAKE_STDOUT on standard output and $FAKE_STDERR on standard error, exits $FAKE_EXIT:
# any answer, well formed or not, without a script per case.
printf '%s' "$FAKE_STDOUT"
printf '%s' "$FAKE_STDERR" >&2
exit "${FAKE_EXIT:-0}"
