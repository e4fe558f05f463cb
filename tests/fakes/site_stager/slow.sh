#!/bin/sh
# Hangs like a script stuck on a tape mount; sleep is a child, so a timeout must kill the group.
echo "waiting for a drive" >&2
sleep 60
echo "too late"
