#!/bin/sh
#SBATCH --partition=train,infer-lend
#SBATCH --requeue
#SBATCH --open-mode=append
# A training job that may borrow idle inference GPUs (hpc_configs/slurm.conf.deepboot). When an
# inference burst takes them back, Slurm selects this job for preemption and, at the start of the
# lending partition's GraceTime, sends SIGTERM to its job steps: the step writes a checkpoint and
# requeues the job at once (the GPUs come back as soon as the checkpoint is written, not at the end of
# the GraceTime), and the next run resumes from the checkpoint. A job that does not requeue itself is
# killed and requeued by Slurm when the GraceTime ends; nothing is lost either way.
#
# The "training" is a counter (a step every STEP_S seconds, STEPS in all) so that the local cluster's
# tests can check that no step is lost or done twice; a real job saves its model where this one saves
# its step. --requeue puts a preempted job back in the queue (or JobRequeue=1 in slurm.conf);
# --open-mode=append keeps the first run's output when the job runs again.
if [ "${DEEPBOOT_STEP:-}" != 1 ]; then
    # the work runs as a job step: Slurm signals steps when the GraceTime starts, the batch script
    # only when it ends (this single-node example re-runs its own spooled copy as the step)
    exec srun --export=ALL,DEEPBOOT_STEP=1 sh "$0"
fi
CKPT="${CKPT:-$PWD/ckpt-${SLURM_JOB_ID:-local}}"
STEPS="${STEPS:-100}"
STEP_S="${STEP_S:-0.1}"
step=0
[ -s "$CKPT" ] && step=$(cat "$CKPT")
now() { date +%s.%N; }
echo "start run=${SLURM_RESTART_COUNT:-0} step=$step node=${SLURMD_NODENAME:-?} partition=${SLURM_JOB_PARTITION:-?} gpus=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}} at $(now)"
save() {
    echo "$step" > "$CKPT.tmp" && mv "$CKPT.tmp" "$CKPT"
}
# Slurm before 24.11 ends a preempted job whose step exits FAILED and does not requeue it: the job
# requeues itself. 24.11 and later requeue the preempted job themselves once its step has ended, and a
# self-requeue on top of that runs the job once more after it completes (measured on 24.11.5 and
# 26.05.5): there the job only saves and exits.
case "$(scontrol version 2>/dev/null)" in
    *" 1"[0-9].*|*" 2"[0-3].*|*" 24.0"[0-9]*) SELF_REQUEUE=1 ;;
    *) SELF_REQUEUE=0 ;;
esac
on_term() {
    # once: Slurm may signal the step again while this runs (its requeue ends the job), and a second
    # pass would save and print the checkpoint twice
    trap '' TERM
    save
    echo "checkpoint step=$step at $(now)"
    # preempted (PreemptTime set), not cancelled: give the GPUs back now
    if scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -q 'PreemptTime=[0-9]'; then
        if [ "$SELF_REQUEUE" = 1 ]; then
            scontrol requeue "$SLURM_JOB_ID" && echo "requeued itself at $(now)"
        else
            echo "preempted: Slurm requeues it at $(now)"
        fi
    fi
    exit 143
}
trap on_term TERM
while [ "$step" -lt "$STEPS" ]; do
    sleep "$STEP_S" &
    wait $!  # a trapped signal interrupts wait at once (not the sleep)
    step=$((step + 1))
    save
done
echo "done step=$step at $(now)"
