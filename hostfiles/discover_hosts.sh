#!/usr/bin/env bash
# Host-discovery script for Horovod elastic runs. horovodrun calls it every second and
# expects one "HOST:SLOTS" line per available host; a host that disappears from the output is
# removed from the job, a new one joins it. This version reads the lines from a file, so a
# person (or a test, or your spot-instance tooling) changes the job by editing that file:
#   HVD_DYNBATCH_HOSTS_FILE=/path/hosts.txt horovodrun -np 2 --min-np 1 --max-np 4 \
#       --host-discovery-script hostfiles/discover_hosts.sh hvd-dynbatch train --elastic ...
# Blank lines and lines starting with '#' are skipped. With no file it prints localhost:2.
# It must exit 0: a failure on the first call ends the elastic job.
set -u
file=${HVD_DYNBATCH_HOSTS_FILE:-}
if [ -z "$file" ] || [ ! -r "$file" ]; then
    echo "localhost:2"
    exit 0
fi
grep -Ev '^[[:space:]]*(#|$)' "$file" | tr -d '[:blank:]\r'
exit 0
