#!/bin/sh
# Any operation, when the tape system cannot be reached: exit 75 (EX_TEMPFAIL) means "try later".
echo "tape library offline: ACSLS not answering" >&2
exit 75
