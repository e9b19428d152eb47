#!/usr/bin/env sh
# A local Redis Cluster (3 masters) and 2 distsched workers, in the foreground until
# Ctrl-C, from the installed redis-server, redis-cli and distsched programs:
#
#   cd deploy && ./local-fleet.sh example_app:FUNCTIONS --workers 4 --concurrency 2
#
# It prints DISTSCHED_REDIS_URL and DISTSCHED_NAMESPACE for other shells. The
# current folder is on the workers' PYTHONPATH. See --help for the options.
exec "${PYTHON:-python3}" -m distsched.tools.fleet "$@"
