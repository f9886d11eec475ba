#!/usr/bin/env bash
# A network of hosts on this machine (network namespaces on a private switch), for trying
# Trainyard across machines by hand; the tests use the same library (tests/hosts/hosts.py).
# Root. Examples:
#   scripts/hosts.sh up --name lab coord w1 w2 s3      # prints the hosts' addresses
#   scripts/hosts.sh exec lab w1 ip addr               # a command on a host
#   scripts/hosts.sh fault lab cut w1                  # kill, cut, partition A B, oneway A B,
#   scripts/hosts.sh fault lab heal w1                 #   loss H P, rate H R, freeze, thaw, heal
#   scripts/hosts.sh down lab                          # removes it (--stale: beds of dead runs)
set -euo pipefail
exec /usr/bin/python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/hosts/hosts.py" "$@"
