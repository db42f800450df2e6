"""The confinement every container of the hub gets: sessions (fgpu_spawner) and the service's own
image checks (queue_service). Here, in the package both may import, so that the two never drift."""

from __future__ import annotations

NO_NEW_PRIVILEGES = "no-new-privileges"
# security_opt entries that would undo the engine's confinement of a container.
LOOSENING_OPTS = ("unconfined", "label=disable", "label:disable", NO_NEW_PRIVILEGES)


def hardening(extra_host_config: dict, writable_layer_size: int = 0) -> dict:
    """No capabilities, no privilege gain through setuid files, and a bounded writable layer."""
    admin_opts = extra_host_config.get("security_opt") or []
    kept = [opt for opt in admin_opts if not any(loose in opt for loose in LOOSENING_OPTS)]
    settings = {
        "cap_drop": ["ALL"],
        "security_opt": [*kept, NO_NEW_PRIVILEGES],
        "privileged": False,
    }
    if writable_layer_size:
        storage = extra_host_config.get("storage_opt") or {}
        settings["storage_opt"] = {**storage, "size": str(writable_layer_size)}
    return settings
