#!/bin/sh
# Stands in for ssh in the two-"node" hostfile test (validate_cli_test.cpp): mpirun calls it as
# `agent [options] HOST COMMAND...` to start its daemon on HOST; it logs HOST to
# $DISTPLAN_TEST_SSH_LOG and runs COMMAND on this machine from /, with a temporary folder of the
# host's own (two daemons sharing one would race on Open MPI's session folders, and hosts share no
# file system).
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
[ -n "${DISTPLAN_TEST_SSH_LOG:-}" ] && echo "$host" >> "$DISTPLAN_TEST_SSH_LOG"
TMPDIR="${TMPDIR:-/tmp}/host-$host"
mkdir -p "$TMPDIR"
export TMPDIR
cd / && exec sh -c "$*"
