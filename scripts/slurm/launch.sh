#!/bin/bash
# Runs `olmoc train` on every task of the Slurm allocation it is called in, and
# requeues the job when Slurm's time-limit warning stopped it.  Called by the
# batch scripts beside it (olmo3-7b-stage1.sbatch, olmo3-7b-stage2.sbatch);
# docs/cluster.md explains the whole cycle.
#
#   scripts/slurm/launch.sh CONFIG.yaml [olmoc train options...]
#
# Environment:
#   OUT_DIR          data.out_dir of the run (required): every attempt of the
#                    job, first launch and requeues alike, runs `--resume` in
#                    it (a fresh start when it holds no checkpoint yet)
#   OLMOC            the olmoc binary (default: build/olmoc)
#   OLMOC_LAUNCHER   srun (default: one task per rank, PMIx wire-up) or
#                    mpirun (OpenMPI's mpirun inside the allocation)
#   OLMOC_INIT_FROM  a checkpoint to start a new stage from (Stage 2 from
#                    Stage 1): used while OUT_DIR holds no checkpoint, with
#                    --with-optimizer-state; once it holds one, --resume
#   OLMOC_REQUEUE    1 (default): requeue the job when olmoc stopped on
#                    SIGUSR1 (exit 138); 0: never
#
# Signals: submit with `--signal=B:USR1@SECONDS` (the batch scripts do).
# The batch shell forwards SIGUSR1 to srun or mpirun, which forward it to
# every rank; the ranks agree to stop after the same step, write a checkpoint
# and exit 138; this script then runs `scontrol requeue`, and the next attempt
# continues from that checkpoint.  SIGTERM (scancel, preemption) also stops
# the ranks with a checkpoint (exit 143) and is not requeued here (a
# preempted job is requeued by Slurm itself when the partition says so).
set -u

if [ $# -lt 1 ]; then
    echo "usage: $0 CONFIG.yaml [olmoc train options...]" >&2
    exit 2
fi
config=$1
shift
: "${OUT_DIR:?set OUT_DIR to the data.out_dir of the run}"
olmoc=${OLMOC:-build/olmoc}
launcher=${OLMOC_LAUNCHER:-srun}
if [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "$0: not inside a Slurm job (submit it with sbatch)" >&2
    exit 2
fi
if [ ! -x "$olmoc" ]; then
    echo "$0: olmoc binary '$olmoc' not found (set OLMOC)" >&2
    exit 2
fi

# Where this attempt starts: the newest complete checkpoint (olmoc's own
# --resume choice; a .tmp-step-* left by a killed save is never one), else
# the previous stage's checkpoint, else the seeded initialisation.
start=(--resume)
if [ -n "${OLMOC_INIT_FROM:-}" ] && ! compgen -G "$OUT_DIR/step-[0-9]*" >/dev/null; then
    start=(--init-from "$OLMOC_INIT_FROM" --with-optimizer-state)
fi

ntasks=${SLURM_NTASKS:-1}
case $launcher in
srun)
    # --kill-on-bad-exit: a rank that dies ends the step instead of leaving
    # the others in a collective.
    # srun does not take sbatch's --cpus-per-task from the environment
    # since Slurm 22.05 unless told
    [ -n "${SLURM_CPUS_PER_TASK:-}" ] && export SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-$SLURM_CPUS_PER_TASK}
    cmd=(srun --mpi=pmix --kill-on-bad-exit=1 "$olmoc") ;;
mpirun)
    # ranks in blocks of a node's tasks (shard groups within a node); OpenMPI
    # takes the nodes and their slots from the allocation
    opts=(-np "$ntasks" --bind-to none)
    [ -n "${SLURM_NTASKS_PER_NODE:-}" ] && opts+=(--map-by "ppr:${SLURM_NTASKS_PER_NODE%%(*}:node")
    [ "$(id -u)" = 0 ] && opts+=(--allow-run-as-root)
    cmd=(mpirun "${opts[@]}" "$olmoc") ;;
*)
    echo "$0: OLMOC_LAUNCHER must be srun or mpirun, not '$launcher'" >&2
    exit 2 ;;
esac

echo "olmoc job $SLURM_JOB_ID attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )): $ntasks ranks on ${SLURM_JOB_NUM_NODES:-1} nodes ($launcher), ${start[*]}"

# The launcher runs in the background so that this shell takes the signals
# as they come (bash runs a trap only between commands) and forwards them.
# SIGTERM (scancel, preemption, the time limit itself) is not forwarded:
# Slurm sends it to every task of every step itself, and a second one would
# make olmoc exit at once, without its checkpoint.
pid=
forward() {
    echo "olmoc job $SLURM_JOB_ID: got SIGUSR1 at $(date '+%F %T'), forwarding it to the ranks"
    [ -n "$pid" ] && kill -s USR1 "$pid" 2>/dev/null
}
trap forward USR1
trap 'echo "olmoc job $SLURM_JOB_ID: got SIGTERM at $(date "+%F %T"); the ranks get it from Slurm"' TERM
"${cmd[@]}" train "$config" --set "data.out_dir=$OUT_DIR" "${start[@]}" "$@" &
pid=$!
# wait returns early (128 + signal) when a trap ran; wait again until the launcher is gone
while wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null; do :; done
wait "$pid" 2>/dev/null && rc=0 || { r=$?; [ "$r" != 127 ] && rc=$r; }

echo "olmoc job $SLURM_JOB_ID: olmoc exited with $rc at $(date '+%F %T')"
if [ "$rc" = 138 ] && [ "${OLMOC_REQUEUE:-1}" = 1 ]; then
    # stopped by the time-limit warning, with a checkpoint: continue in a new attempt
    echo "olmoc job $SLURM_JOB_ID: requeued; the next attempt resumes from the newest checkpoint in $OUT_DIR"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
