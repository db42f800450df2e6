"""Stopping writes to a storage folder inside a running session, when the measure round finds
the folder past its owner's storage quota (folders.py `stop_writes_past_quota` decides which).

Docker cannot change a running container's mounts, and a folder's directory cannot be made
read-only for one session's uid on the host (every session writes as the same uid 1000; a
`chmod a-w` of the folder's top directory would only stop new top-level entries). So the
service turns the session's bind mount itself read-only, in the container's own mount
namespace: `nsenter -t <container pid> -m mount -o remount,bind,ro,nosuid,nodev <target>`. A
write from inside then fails with EROFS ("Read-only file system"), whatever the session does to file
modes, and the session cannot undo it: it runs unprivileged, without CAP_SYS_ADMIN.

- **Who can.** It needs root in the host's namespaces (the service runs as root) and the
  container's pid on this machine: it works where the sessions run on the service's own engine
  (single-host mode). On a Swarm, the containers are on other nodes; there a folder past its
  owner's quota is mounted read-only at each session's next start only (SwarmEngine has no
  `stop_folder_writes`), and the kernel's project quotas, where the site has them, hold the owner's own
  quota at once on every node.
- **Until when.** A remounted session stays read-only until it is started again: the next
  start mounts the folder read-write again once its owner is back under quota.
"""

from __future__ import annotations

import subprocess

from queue_service.engine.session_containers import running_session_containers

#: A bind remount sets the mount's flags anew: nosuid and nodev are said again, or they would go.
REMOUNT = "remount,bind,ro,nosuid,nodev"


def stop_folder_writes(client, session_id: str, source: str) -> list[str]:
    """Make every read-write bind of the host directory `source` in the session's live
    container read-only; the container paths remounted (none without a live container).
    Raises CalledProcessError with nsenter's words when the kernel refuses."""
    container = running_session_containers(client, session_id).get(session_id)
    if container is None:
        return []
    container.reload()  # the listing is sparse: no pid, no mounts
    pid = container.attrs["State"]["Pid"]
    targets = [
        mount["Destination"]
        for mount in container.attrs.get("Mounts", [])
        if mount.get("Type") == "bind" and mount.get("Source") == source and mount.get("RW")
    ]
    for target in targets:
        subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "mount", "-o", REMOUNT, target],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
    return targets
