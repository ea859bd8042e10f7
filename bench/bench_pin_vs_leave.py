"""When nothing is free at submit time: pin the job to the GPU predicted to free first, or leave it to
Slurm (which starts it on whichever GPU really frees first)? horusd leaves it to Slurm; this shows why.

A discrete-event replay of single-GPU jobs on G exclusive GPUs, FIFO, at a load that keeps a queue:
- ``leave``: a waiting job starts on the first GPU that frees (what Slurm does with an untouched job);
- ``pin``: at submission a job that finds no free GPU is pinned to the GPU whose *predicted* end
  (start + predicted duration, as horusd would know it) is earliest, and waits for exactly that GPU.
Predicted durations are the true ones times a log-normal error (sigma), as user time limits and
history-based guesses are. Durations: log-normal with the median and spread of Philly's GPU jobs
(about 15 min median, heavy tail); no ../shared data needed. Prints JSON (mean JCT, mean wait).
"""

import heapq
import json

import numpy as np


def replay(arrivals, durations, predicted, gpus, pin):
    predicted_free = np.zeros(gpus)  # what the scheduler believes
    queue_per_gpu = [[] for _ in range(gpus)]  # pinned: FIFO per GPU
    jct = np.zeros(len(arrivals))
    waiting = []  # leave: global FIFO heap of (arrival, job)
    events = []  # (time, kind, job or gpu)
    for job, t in enumerate(arrivals):
        heapq.heappush(events, (t, 1, job))

    def start(job, gpu, now):
        end = now + durations[job]
        # what the scheduler expects: this job, then the jobs already pinned behind it
        predicted_free[gpu] = now + predicted[job] + sum(predicted[q] for q in queue_per_gpu[gpu])
        jct[job] = end - arrivals[job]
        heapq.heappush(events, (end, 0, gpu))

    idle = set(range(gpus))
    while events:
        now, kind, what = heapq.heappop(events)
        if kind == 1:  # arrival
            job = what
            if idle:
                gpu = min(idle)
                idle.remove(gpu)
                start(job, gpu, now)
            elif pin:
                gpu = int(np.argmin(predicted_free))
                queue_per_gpu[gpu].append(job)
                predicted_free[gpu] += predicted[job]  # the next pinned job expects this one too
            else:
                waiting.append(job)
        else:  # a GPU freed
            gpu = what
            if pin and queue_per_gpu[gpu]:
                start(queue_per_gpu[gpu].pop(0), gpu, now)
            elif not pin and waiting:
                start(waiting.pop(0), gpu, now)
            else:
                idle.add(gpu)
    return jct


def main():
    rng = np.random.default_rng(0)
    gpus, jobs = 64, 20000
    durations = rng.lognormal(np.log(900), 1.4, jobs)
    out = {"benchmark": "pin_vs_leave_when_full", "gpus": gpus, "jobs": jobs, "results": []}
    for load in (0.9, 1.0):
        arrivals = np.cumsum(rng.exponential(durations.mean() / gpus / load, jobs))
        for sigma in (0.0, 0.5, 1.0):
            predicted = durations * rng.lognormal(0.0, sigma, jobs)
            leave = replay(arrivals, durations, predicted, gpus, pin=False)
            pin = replay(arrivals, durations, predicted, gpus, pin=True)
            out["results"].append({
                "load": load, "prediction_error_sigma": sigma,
                "leave_mean_jct_s": round(float(leave.mean()), 1), "pin_mean_jct_s": round(float(pin.mean()), 1),
                "pin_over_leave": round(float(pin.mean() / leave.mean()), 3),
            })
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
