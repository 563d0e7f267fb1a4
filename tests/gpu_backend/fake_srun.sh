#!/bin/sh
# Stands in for srun in validate_cli_test.cpp: logs its arguments to $DISTPLAN_TEST_SRUN_LOG and
# runs the program under mpirun with --ntasks ranks (srun's other options are dropped).
[ -n "${DISTPLAN_TEST_SRUN_LOG:-}" ] && echo "$*" >> "$DISTPLAN_TEST_SRUN_LOG"
unset SLURM_JOB_ID SLURM_JOBID  # mpirun would read the allocation from them
n=1
while [ "${1#-}" != "$1" ]; do
  case "$1" in --ntasks=*) n=${1#--ntasks=} ;; esac
  shift
done
exec mpirun -np "$n" --oversubscribe "$@"
