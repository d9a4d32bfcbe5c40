#!/usr/bin/env bash
# Install Debian's slurm-wlm and munge for the SLURM tests (tests/_slurm.py, tests/test_slurm.py), when
# they are missing. Needs root and apt-get; never fails: without them the SLURM tests skip, saying why.
if command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: slurm-wlm is not installed and this is not a root Debian shell: the SLURM tests will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if timeout 300 apt-get update -qq && timeout 600 apt-get install -y -qq slurm-wlm munge >/dev/null; then
    echo "installed slurm-wlm and munge (the SLURM tests run)"
else
    echo "warning: apt-get could not install slurm-wlm and munge: the SLURM tests will skip" >&2
fi
exit 0
