"""The configuration files of a local cluster, rendered from its layout and ports.

Settings follow what was verified on Slurm 22.05.8 (docs/local-cluster.md explains each one):
``DefMemPerCPU`` so jobs can share a node, ``SlurmdParameters=config_overrides`` so a small machine
can advertise 8 CPUs per node, ``Boards=1 SocketsPerBoard=1`` (else SocketsPerBoard comes out as 8),
and fast ``SchedulerParameters`` (else a pinned job can wait ~25 s for backfill).
"""

CPUS_PER_NODE = 8
REAL_MEMORY_MB = 4000
DEF_MEM_PER_CPU_MB = 250
SHARDS_PER_GPU = 2


def node_names(nodes):
    return [f"n{i}" for i in range(1, nodes + 1)]


def gpu_types(gpus):
    """One GRES type per GPU index (g0..gK), so a job can ask for an exact GPU."""
    return [f"g{k}" for k in range(gpus)]


def accounting_tres(gpus):
    # Per-type gpu TRES make sacct record which GPU a job had (there is no IDX in accounting).
    # Shard TRES stay untyped: Slurm 22.05 records a typed shard request only as gres/shard.
    return ",".join(["gres/gpu", "gres/shard"] + [f"gres/gpu:{t}" for t in gpu_types(gpus)])


def slurm_conf(layout, ports, nodes, gpus, cluster_name, with_dbd, job_submit_plugin=True, partitions=None,
               extra_lines=(), cred_expire=None, controllers=("localhost",), node_addr="127.0.0.1",
               shards_per_gpu=SHARDS_PER_GPU):
    """slurm.conf text. ``layout`` is a ClusterLayout, ``ports`` a dict of port numbers;
    ``controllers`` the SlurmctldHost values in order (a backup controller: see backup.py)."""
    d = layout
    node_gres = ",".join([f"gpu:{t}:1" for t in gpu_types(gpus)] + [f"shard:{shards_per_gpu * gpus}"])
    lines = [
        f"ClusterName={cluster_name}",
        *(f"SlurmctldHost={controller}" for controller in controllers),
        f"SlurmctldPort={ports['slurmctld']}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # cred_expire also sets how long a requeued job waits before it may start again (default 120 s)
        f"AuthInfo=socket={d.munge_socket}" + (f",cred_expire={cred_expire}" if cred_expire else ""),
        "CredType=cred/munge",
        f"StateSaveLocation={d.state}",
        f"SlurmdSpoolDir={d.spool}/%n",
        f"SlurmctldPidFile={d.run}/slurmctld.pid",
        f"SlurmdPidFile={d.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={d.log}/slurmctld.log",
        f"SlurmdLogFile={d.log}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        f"PlugStackConfig={d.etc}/plugstack.conf",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=5",
        "JobSubmitPlugins=lua" if job_submit_plugin else "#JobSubmitPlugins=lua (off for this cluster)",
        "GresTypes=gpu,shard,mps",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=task=2",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={d.log}/jobcomp.txt",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "MinJobAge=300",
        f"DefMemPerCPU={DEF_MEM_PER_CPU_MB}",
        "KillWait=5",
    ]
    if with_dbd:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={ports['slurmdbd']}",
            # sacct/sacctmgr talk to slurmdbd through munge too; this tells them our socket.
            f"AccountingStoragePass={d.munge_socket}",
            f"AccountingStorageTRES={accounting_tres(gpus)}",
            "AccountingStoreFlags=job_comment",
        ]
    else:
        lines.append("AccountingStorageType=accounting_storage/none")
    for index, name in enumerate(node_names(nodes)):
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr={node_addr} Port={ports['slurmd'][index]} "
            f"CPUs={CPUS_PER_NODE} Boards=1 SocketsPerBoard=1 CoresPerSocket={CPUS_PER_NODE} "
            f"ThreadsPerCore=1 RealMemory={REAL_MEMORY_MB} Gres={node_gres} State=UNKNOWN"
        )
    # partitions: None = one "debug" partition over all nodes; else complete PartitionName= lines
    lines.extend(partitions or ["PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"])
    lines.extend(extra_lines)
    return "\n".join(lines) + "\n"


def deepboot_conf(train_nodes, infer_nodes, grace_s=10):
    """(PartitionName lines, other slurm.conf lines) of hpc_configs/slurm.conf.deepboot for a local
    cluster: ``train`` and ``infer`` partitions, ``infer-lend`` (training on idle inference GPUs,
    requeued when inference preempts it, with ``grace_s`` of GraceTime) and ``train-lend`` over both
    (a multi-node borrower that can be shrunk off the inference nodes)."""
    lend = f"MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={grace_s}"
    partitions = [
        f"PartitionName=train Nodes={train_nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
        f"PartitionName=infer Nodes={infer_nodes} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
        f"PartitionName=infer-lend Nodes={infer_nodes} {lend}",
        f"PartitionName=train-lend Nodes={train_nodes},{infer_nodes} {lend}",
    ]
    return partitions, ["PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE"]


def gres_conf(layout, nodes, gpus, shards_per_gpu=SHARDS_PER_GPU):
    """gres.conf: one typed gpu line and one shard line per fake GPU (``%n`` does not work in File=)."""
    lines = ["AutoDetect=off"]
    for name in node_names(nodes):
        for k, gpu_type in enumerate(gpu_types(gpus)):
            lines.append(f"NodeName={name} Name=gpu Type={gpu_type} File={layout.gpu_device(name, k)}")
        for k in range(gpus):
            lines.append(f"NodeName={name} Name=shard Count={shards_per_gpu} File={layout.gpu_device(name, k)}")
    return "\n".join(lines) + "\n"


def slurmdbd_conf(layout, ports):
    d = layout
    return "\n".join([
        "AuthType=auth/munge",
        f"AuthInfo=socket={d.munge_socket}",
        "DbdHost=localhost",
        f"DbdPort={ports['slurmdbd']}",
        "SlurmUser=root",
        f"LogFile={d.log}/slurmdbd.log",
        f"PidFile={d.run}/slurmdbd.pid",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={ports['mariadb']}",
        f"StorageUser={DB_USER}",
        f"StoragePass={DB_PASSWORD}",
        f"StorageLoc={DB_NAME}",
    ]) + "\n"


# The private MariaDB only listens on 127.0.0.1 inside a throw-away directory.
DB_USER = "slurm"
DB_PASSWORD = "slurmpw"
DB_NAME = "slurm_acct_db"
