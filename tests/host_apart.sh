#!/bin/sh
# host_apart.sh HOST_DIR SEEN_DIR COMMAND...: one rank of a job, as if ranks other than 0 ran on
# a host that shares no filesystem with rank 0's, on one machine. Rank 0 (HOROVOD_RANK, else
# Open MPI's rank) runs COMMAND as it is; any other rank runs it in a mount namespace of its own
# where SEEN_DIR shows HOST_DIR's files instead (mounting needs root).
set -eu
host_dir=$1 seen_dir=$2
shift 2
if [ "${HOROVOD_RANK:-${OMPI_COMM_WORLD_RANK:-0}}" = 0 ]; then
    exec "$@"
fi
exec unshare --mount --propagation private sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \
    host_apart "$host_dir" "$seen_dir" "$@"
