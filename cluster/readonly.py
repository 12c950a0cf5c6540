"""Folders a process tree cannot write, as a pod's read-only root filesystem: the home of a rehearsal's pods
(cluster/rehearse.py) is read-only for every process of its node, and only the pod's mounted volumes are
writable."""

from __future__ import annotations

import os

# Run as root, the node's processes get a mount namespace of their own in which each read-only folder is a
# read-only bind mount of itself (as a pod's read-only root filesystem: writes fail with EROFS); nothing
# changes outside it, and it ends with the node's processes. Root ignores file modes, so this is the only
# way to refuse root a write; another user gets the folders' write bits removed instead (make_readonly).
_RO_MOUNTS = ('while [ "$1" != -- ]; do mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 1; shift; '
              'done; shift; exec "$@"')


def readonly_wrapper(folders: list[str]) -> list[str]:
    """Pure (given the user): the argv prefix that starts a command with `folders` read-only."""
    if not folders or os.geteuid() != 0:
        return []
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _RO_MOUNTS, "sh", *folders, "--"]


def make_readonly(folders: list[str], writable: bool = False) -> None:
    """Another user than root: clear (or, `writable`, restore) the write bits of the folders and the folders
    below them; symbolic links are not followed, so what they point at keeps its modes."""
    if os.geteuid() == 0:
        return
    for top in folders:
        for folder, subdirs, _ in os.walk(top):
            for path in [folder, *(os.path.join(folder, x) for x in subdirs)]:
                if not os.path.islink(path):
                    mode = os.stat(path).st_mode
                    os.chmod(path, (mode | 0o200) if writable else (mode & ~0o222))
