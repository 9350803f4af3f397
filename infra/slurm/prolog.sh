#!/bin/bash
# Slurm node prolog (slurm.conf: Prolog=/path/to/infra/slurm/prolog.sh, PrologFlags=Alloc).
# slurmd runs it as root on every node before the job starts; a nonzero exit drains the node and
# requeues the job, so a bad node is taken out before training starts on it.
# DYNA_PYTHON / DYNA_WORKDIR: the interpreter and checkout that have infra.preflight.
set -uo pipefail
PYTHON=${DYNA_PYTHON:-python3}
cd "${DYNA_WORKDIR:-$(dirname "$0")/../..}" || exit 1
LOG_DIR=${DYNA_PROLOG_LOG_DIR:-/var/log/dyna}
mkdir -p "$LOG_DIR" 2>/dev/null || LOG_DIR=/tmp
if ! "$PYTHON" -m infra.preflight > "$LOG_DIR/preflight-${SLURM_JOB_ID:-none}.log" 2>&1; then
  echo "preflight failed on $(hostname) for job ${SLURM_JOB_ID:-?}; see $LOG_DIR/preflight-${SLURM_JOB_ID:-none}.log" >&2
  exit 1
fi
