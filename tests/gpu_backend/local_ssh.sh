#!/bin/sh
# Stands in for ssh in the two-"node" hostfile test (validate_cli_test.cpp): mpirun calls it as
# `agent [options] HOST COMMAND...` to start its daemon on HOST; it logs HOST to
# $DISTPLAN_TEST_SSH_LOG and runs COMMAND on this machine, from / (not the launcher's folder).
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
[ -n "${DISTPLAN_TEST_SSH_LOG:-}" ] && echo "$host" >> "$DISTPLAN_TEST_SSH_LOG"
cd / && exec sh -c "$*"
