"""Trace readers on tiny made-up files (never the shared data)."""

import pytest

from slurm_horus.errors import InputError
from slurm_horus.sim.traces import PolluxApplications, guess_format, read_trace


def write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_generic_csv(tmp_path):
    path = write(tmp_path, "g.csv", "job_id,submit_time,duration,num_gpus,job_class,gpus_per_node,user\n"
                                    "a,0,100,1,lm-bs20,,alice\nb,5.5,20,4,,2,bob\n")
    jobs = read_trace(path)
    assert [(j.job_id, j.submit_time, j.duration, j.num_gpus, j.job_class, j.gpus_per_node, j.user) for j in jobs] == [
        ("a", 0.0, 100.0, 1, "lm-bs20", 0, "alice"), ("b", 5.5, 20.0, 4, None, 2, "bob")]
    assert guess_format(path) == "generic"


@pytest.mark.parametrize("text,message", [
    ("submit_time,num_gpus\n0,1\n", "g.csv:1: missing column(s) duration"),
    ("submit_time,duration,num_gpus\n0,100,1\n3,-5,1\n", "g.csv:3: duration='-5' must be >= 0.0"),
    ("submit_time,duration,num_gpus\n0,abc,1\n", "g.csv:2: duration='abc' is not a number"),
    ("submit_time,duration,num_gpus\n0,10,0\n", "g.csv:2: num_gpus='0' must be >= 1"),
    ("submit_time,duration,num_gpus,gpus_per_node\n0,10,3,2\n", "g.csv:2: num_gpus=3 is not a multiple"),
    ("", "g.csv:1: empty file"),
])
def test_generic_errors_name_file_and_line(tmp_path, text, message):
    path = write(tmp_path, "g.csv", text)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_trace(path, "generic")


def test_philly_job_table(tmp_path):
    path = write(tmp_path, "philly.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n"
                                         "2017-10-09 07:01:55,66.0,1,66.0,vc1\n"
                                         "2017-10-09 07:00:55,30.0,8,240.0,vc2\n")
    jobs = read_trace(path)
    assert guess_format(path) == "philly"
    assert [(j.submit_time, j.duration, j.num_gpus, j.user) for j in jobs] == [(60.0, 66.0, 1, "vc1"),
                                                                              (0.0, 30.0, 8, "vc2")]
    bad = write(tmp_path, "bad.csv", "timestamp,duration,num_gpus\nyesterday,1,1\n")
    with pytest.raises(InputError, match="bad.csv:2: timestamp"):
        read_trace(bad, "philly")


def test_gavel_seven_and_ten_fields(tmp_path):
    seven = "ResNet-18 (batch size 64)\tpython3 main.py\t--num_steps\t1\t1000\t12.000000\t1\n"
    ten = "LM (batch size 20)\tpython3 main.py\tlm\t--steps\t1\t500\t2\t1\t-1.000000\t30\n"
    path = write(tmp_path, "t.trace", seven + ten)
    rates = {"resnet18-bs64": 10.0, "lm-bs20": 5.0}
    jobs = read_trace(path, solo_tput=rates.get)
    assert [(j.job_class, j.duration, j.submit_time, j.num_gpus) for j in jobs] == [
        ("resnet18-bs64", 100.0, 12.0, 1), ("lm-bs20", 100.0, 30.0, 2)]
    with pytest.raises(InputError, match="t.trace:2: unknown class 'lm-bs20'"):
        read_trace(path, solo_tput={"resnet18-bs64": 10.0}.get)
    short = write(tmp_path, "s.trace", "A3C\tcmd\t5\n")
    with pytest.raises(InputError, match="s.trace:1: 3 tab-separated fields"):
        read_trace(short, solo_tput=rates.get)


def _pollux_app(root, app="toy"):
    write(root, f"traces/{app}/validation-100.csv", "progress,iteration,metric,grad_sqr,grad_var\n"
                                                  "10,10,1,1,1\n200,200,2,1,1\n")
    write(root, f"traces/{app}/validation-400.csv", "progress,iteration,metric,grad_sqr,grad_var\n"
                                                  "50,50,1,1,1\n")
    write(root, f"traces/{app}/placements.csv", "placement,local_bsz,step_time,sync_time\n"
                                               "1,100,0.5,0.0\n2,50,0.3,0.1\n24,20,1.0,0.5\n")


def test_pollux_duration_rule(tmp_path):
    _pollux_app(tmp_path)
    apps = PolluxApplications(tmp_path / "traces")
    assert apps.placement_key(6) == "24" and apps.placement_key(8) == "44" and apps.placement_key(3) == "3"
    # batch 100 → validation-100: 200 steps; 1 replica, local 100 → 0.5 s/step
    assert apps.duration("toy", 1, 100) == pytest.approx(100.0)
    # batch 100 on 2 replicas: local 50 → 0.3 + 0.1 s/step
    assert apps.duration("toy", 2, 100) == pytest.approx(80.0)
    # batch 300 is nearer 400 (log scale): 50 steps × 400/300 samples-equivalent; 6 replicas → "24"
    assert apps.duration("toy", 6, 300) == pytest.approx(50 * 400 / 300 * 1.5)


def test_pollux_and_deepboot_workloads(tmp_path):
    _pollux_app(tmp_path)
    pollux = write(tmp_path, "workloads/w.csv", "name,time,application,num_replicas,batch_size\ntoy-0,7,toy,1,100\n")
    jobs = read_trace(pollux)
    assert guess_format(pollux) == "pollux"
    assert [(j.job_id, j.submit_time, j.duration, j.partition, j.job_class) for j in jobs] == [
        ("toy-0", 7.0, 100.0, "", None)]
    deepboot = write(tmp_path, "workloads/d.csv", "name,time,application,num_replicas,batch_size,duration,num_task\n"
                                                  "toy-0,7,toy,1,100,4.0,-1\n"
                                                  "inference-bert-1,9,infer-bert-1,1,1,6.0,530\n")
    jobs = read_trace(deepboot)
    assert [(j.partition, j.kind, j.duration, j.job_class) for j in jobs] == [
        ("train", "train", 100.0, None), ("infer", "infer", 6.0, "infer-bert")]
    unknown = write(tmp_path, "workloads/u.csv", "name,time,application,num_replicas,batch_size\nx,0,nope,1,8\n")
    with pytest.raises(InputError, match="u.csv:2: unknown application 'nope'"):
        read_trace(unknown)


def test_tiresias_csv(tmp_path):
    path = write(tmp_path, "t.csv", "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                                    "1,2,10,100,resnet50,3600,0\n")
    jobs = read_trace(path)
    assert guess_format(path) == "tiresias"
    assert [(j.job_id, j.num_gpus, j.submit_time, j.duration, j.extra) for j in jobs] == [
        ("1", 2, 10.0, 3600.0, {"model": "resnet50"})]


def test_tiresias_time_unit_ms_and_the_warning(tmp_path):
    from slurm_horus.sim.traces import time_unit_warning
    rows = "".join(f"{k},1,{k * 60000},10,resnet50,{(k + 2) * 3600000},0\n" for k in range(5))
    path = write(tmp_path, "t.csv", "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n" + rows)
    as_seconds = read_trace(path)
    assert [j.duration for j in as_seconds] == [(k + 2) * 3600000.0 for k in range(5)]
    warning = time_unit_warning(as_seconds)
    assert "look like milliseconds" in warning and "--time-unit ms" in warning
    in_ms = read_trace(path, time_unit="ms")
    assert [(j.submit_time, j.duration) for j in in_ms] == [(k * 60.0, (k + 2) * 3600.0) for k in range(5)]
    assert time_unit_warning(in_ms) is None
    with pytest.raises(InputError, match="Tiresias-format traces only"):
        read_trace(write(tmp_path, "g.csv", "submit_time,duration,num_gpus\n0,100,1\n"), time_unit="ms")
    with pytest.raises(InputError, match="time unit 'h'"):
        read_trace(path, time_unit="h")


def test_alibaba_pods(tmp_path):
    path = write(tmp_path, "pods.csv",
                 "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                 "scheduled_time\n"
                 "p1,1000,100,1,500,,LS,Running,100,400,110\n"
                 "p2,2000,300,0,0,,BE,Running,100,200,100\n"
                 "p3,1000,100,2,1000,V100M16|V100M32,LS,Running,150,350,150\n")
    jobs = read_trace(path)
    assert guess_format(path) == "alibaba"
    # CPU-only pods are kept (they take CPUs that GPU requests need: FGD's fragmentation counts them)
    assert [(j.job_id, j.submit_time, j.duration, j.num_gpus, j.gpu_fraction, j.gpu_milli, j.cpu_milli,
             j.memory_mib, j.gpu_types) for j in jobs] == [
        ("p1", 0.0, 290.0, 1, 0.5, 500, 1000.0, 100.0, ()), ("p2", 0.0, 100.0, 0, 1.0, 0, 2000.0, 300.0, ()),
        ("p3", 50.0, 200.0, 2, 1.0, 1000, 1000.0, 100.0, ("v100m16", "v100m32"))]
    over = write(tmp_path, "over.csv", "name,num_gpu,gpu_milli,creation_time,deletion_time\np,1,1500,0,5\n")
    with pytest.raises(InputError, match="over.csv:2: gpu_milli=1500 is more than one GPU"):
        read_trace(over, "alibaba")
    bad = write(tmp_path, "bad.csv", "name,num_gpu,gpu_milli,creation_time,deletion_time\np,1,1000,100,50\n")
    with pytest.raises(InputError, match="bad.csv:2: deletion_time"):
        read_trace(bad, "alibaba")


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(InputError, match="no such trace file"):
        read_trace(str(tmp_path / "nope.csv"))
    path = write(tmp_path, "g.csv", "submit_time,duration,num_gpus\n0,1,1\n")
    with pytest.raises(InputError, match="unknown trace format"):
        read_trace(path, "slurmdb")
