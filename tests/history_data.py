"""A made-up job row for the history tests (the columns `horus ingest` writes), and collector samples."""


def job(job_id, cls, start, elapsed, gpu, node="n1", state="COMPLETED"):
    return {"cluster": "lab", "job_id": job_id, "array_job_id": None, "array_task_id": None,
            "name": cls, "user": "alice", "account": "ml", "partition": "gpu", "qos": "normal",
            "state": state, "exit_code": 0, "exit_signal": None, "submit_time": start,
            "start_time": start, "end_time": start + elapsed, "elapsed_s": elapsed,
            "time_limit_min": 60, "nodes": node, "n_nodes": 1, "n_cpus": 1, "mem_mb": 250.0,
            "n_gpus": 1, "gres_alloc": f"gpu:g{gpu}=1,gpu=1", "gres_req": None,
            "gpu_indices": str(gpu), "shards": 0, "comment": f"class={cls}", "admin_comment": None,
            "horus_id": None, "horus_tokens": None, "job_class": cls, "cpu_time_s": None, "max_rss_mb": None}


def samples(job_id, gpu, start, seconds, sm, mem, shared=0, node="n1"):
    """Collector batches (every 5 s) of job ``job_id`` on GPU ``gpu`` of ``node``."""
    return [{"gpus": [{"node": node, "gpu_index": gpu, "ts": t, "gpu_util": sm, "mem_total_mb": 16384.0,
                       "job_ids": str(job_id)}],
             "jobs": [{"job_id": job_id, "node": node, "gpu_index": gpu, "ts": t, "sm_util": sm,
                       "mem_used_mb": mem, "shared": shared, "n_procs": 1}]}
            for t in range(start, start + seconds, 5)]
