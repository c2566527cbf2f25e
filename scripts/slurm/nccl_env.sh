# NCCL and MPI settings for olmoc on a GPU cluster; sourced by the batch
# scripts beside it.  Each is set only when the environment does not set it
# already, so a site's module or a user's export wins.  olmoc moves
# gradients and parameter shards with NCCL (all-gathers and reduce-scatters
# inside a node's shard group, the gradient all-reduce across nodes) and
# only loss sums, the NCCL id and checkpoint gathers with MPI.

# Warnings only; INFO on a first run shows the transports NCCL picked (NVLink
# within a node, InfiniBand/RoCE or a plugin across nodes): a job that falls
# back to TCP sockets across nodes runs many times slower without an error.
: "${NCCL_DEBUG:=WARN}"
# With NCCL_DEBUG=INFO, one file a process instead of interleaved lines.
: "${NCCL_DEBUG_FILE:=nccl-%h-%p.log}"
export NCCL_DEBUG NCCL_DEBUG_FILE

# The interface for NCCL's bootstrap and socket transport.  NCCL picks ib*
# first, then anything but lo and docker*; on nodes whose first interface is
# a management network set the data network, e.g. NCCL_SOCKET_IFNAME=eth0 or
# =^lo,docker (excluded names).  Left to NCCL unless set.
#   export NCCL_SOCKET_IFNAME=...

# InfiniBand: which HCAs (all by default).  Nodes with a storage HCA beside
# the compute HCAs should list the compute ones (mlx5_0,mlx5_1,...), or the
# gradient all-reduce shares a port with the file system.
#   export NCCL_IB_HCA=...
# RoCE: the GID index of RoCE v2 (often 3) when NCCL's choice fails.
#   export NCCL_IB_GID_INDEX=3
# The InfiniBand verbs timeout, 4.096 us x 2^N: on large fabrics a higher
# value rides out congestion instead of failing the job with a timeout error.
: "${NCCL_IB_TIMEOUT:=22}"
export NCCL_IB_TIMEOUT

# Cloud fabrics need their NCCL network plugin (AWS EFA: aws-ofi-nccl with
# FI_PROVIDER=efa; Google Cloud: its gIB/TCPXO plugin): load the site's module.

# OpenMPI: with srun --mpi=pmix every rank is one Slurm task and MPI needs no
# more.  Its traffic is small (loss sums, checkpoint gathers); on InfiniBand
# clusters OpenMPI uses UCX by itself.  As root (containers) mpirun needs
# --allow-run-as-root (launch.sh adds it).
